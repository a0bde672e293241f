"""A test subject whose verdict is a coin toss: the reference runtime with a race."""
