"""Fault injection with real processes: `python manage.py chaos` and tests/chaos/.

A test harness, not part of the product: nothing under ledger/, runs/, approvals/ or console/
imports it, except the `chaos` management command that runs it. stack.py starts workers (through
worker.py), beat and the sandbox providers; seams.py is the hook those workers install into the
dispatcher's seams (ledger/seams.py) so the harness can stop a worker at an exact point of the
protocol; scenarios.py drives one trial each; invariants.py checks the ledger against the
providers' effect logs.
"""
