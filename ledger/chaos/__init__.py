"""Fault injection with real processes: `python manage.py chaos` and tests/chaos/.

stack.py starts workers, beat and the sandbox providers; seams.py lets the harness stop a worker
at an exact point of the protocol; scenarios.py drives one trial each; invariants.py checks the
ledger against the providers' effect logs.
"""
