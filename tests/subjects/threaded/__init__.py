"""threaded: the reference runtime behind a module that starts a thread when it is
imported, as CrewAI's event bus and many SDKs' telemetry do. A process with that thread
running is not forked from (:mod:`crashmatrix.harness.zygote`): the zygote finds it and
its workers import this module after their fork."""
