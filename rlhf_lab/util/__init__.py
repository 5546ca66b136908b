"""The bottom of the stack: what every other part uses and which imports nothing of the lab.

validation.py   one way to check a setting (errors name the field and the allowed values)
device.py       which device to run on, autocast, a one-line description of the machine
limits.py       sizes checked before any work: positions, token ids, memory
atomic.py       atomic writes, folder replacement, a folder lock, signals deferred during a write
allocator.py    process-wide tuning of glibc's allocator, opt-in (the CLI and bench/ turn it on)
fast_paths.py   the one switch between the plain definitions and their fast versions
"""
