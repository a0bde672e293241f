"""A new user's checkout workload whose model sends an upper-case currency."""
