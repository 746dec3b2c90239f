"""`python manage.py chaos --scenario X --trials N --seed S`: fault injection with real processes.

Starts Celery workers, beat and both sandbox providers against the configured database (and
CELERY_BROKER_URL if it is Redis; otherwise a file-system broker of its own), runs N trials of
one scenario (or `all`), checks the invariants after each against the providers' effect logs,
and ends with exactly one line:

    chaos: trials=N duplicates=D lost=L stuck=S violations=V

The exit status is non-zero if any count but trials is. See docs/reliability.md.
"""

from __future__ import annotations

import logging
import random
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from tqdm import tqdm

from chaos import scenarios
from chaos.invariants import Tally
from chaos.stack import ChaosStack, database_url_for


def runnable_on(chosen: list[scenarios.Scenario], vendor: str):
    """(to run, skipped) on this database. Scenario 6 cuts the workers' connections to a database
    server; SQLite has none. Asked for by itself it is an error; within `all` it is skipped,
    said so on stderr, and not counted in the trials."""
    skipped = [s for s in chosen if s.needs_postgres and vendor != "postgresql"]
    if skipped and len(chosen) == 1:
        raise CommandError(f"scenario {skipped[0].number}/{skipped[0].name} needs PostgreSQL (it drops the workers' "
                           f"database connections mid-commit; {vendor} has none): set DATABASE_URL=postgres://…")
    return [s for s in chosen if s not in skipped], skipped


class Command(BaseCommand):
    help = "Run chaos trials (worker kills, zombies, duplicate deliveries, faults) and check the ledger's invariants."

    def add_arguments(self, parser):
        names = ", ".join(f"{s.number}/{s.name}" for s in scenarios.SCENARIOS.values())
        parser.add_argument("--scenario", default="all", help=f"One of {names}, or all (the default).")
        parser.add_argument("--trials", type=int, default=10, help="Trials per scenario.")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--workers", type=int, default=None, help="Celery workers (default: the scenario's).")
        parser.add_argument("--quiet-seconds", type=float, default=scenarios.QUIET_SECONDS,
                            help="How long a trial's operations may take to settle.")
        parser.add_argument("--no-migrate", action="store_true", help="Do not migrate the database first.")
        parser.add_argument("--verbose-findings", action="store_true", help="Print every finding to stderr.")
        parser.add_argument("--allow-production", action="store_true",
                            help="Run even with COUNTERSIGN_ENV=production (it creates a 'chaos' tenant and tools).")

    def handle(self, *args, scenario: str, trials: int, seed: int, workers: int | None, quiet_seconds: float,
               no_migrate: bool, verbose_findings: bool, allow_production: bool, **options):
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("kombu").setLevel(logging.ERROR)
        if not settings.EMBEDDED and not allow_production:
            raise CommandError("chaos writes a 'chaos' tenant, tools and operations into the configured database; "
                               "pass --allow-production to run it with COUNTERSIGN_ENV=production.")
        if trials < 1:
            raise CommandError("--trials must be at least 1.")
        try:
            chosen = (list(scenarios.SCENARIOS.values()) if scenario == "all"
                      else [scenarios.get_scenario(scenario)])
        except KeyError as exc:
            raise CommandError(str(exc.args[0])) from exc
        chosen, skipped = runnable_on(chosen, connection.vendor)
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        broker = settings.CELERY_BROKER_URL if settings.CELERY_BROKER_URL.startswith(("redis://", "amqp://")) else None
        database_url = database_url_for(connection.settings_dict)
        world = scenarios.ensure_world()
        tally = Tally()
        notes: list[str] = []
        rng = random.Random(seed)
        for chosen_scenario in chosen:
            options = chosen_scenario.stack_options()
            if workers:
                options["workers"] = workers
            stack = ChaosStack(database_url=database_url, broker_url=broker, **options)
            with stack:
                bar = tqdm(range(trials), desc=f"{chosen_scenario.number}/{chosen_scenario.name}", unit="trial",
                           file=sys.stderr, dynamic_ncols=True)
                for index in bar:
                    findings = scenarios.run_trial(chosen_scenario, stack, world, rng, index,
                                                   quiet_seconds=quiet_seconds, notes=notes)
                    tally.trials += 1
                    tally.add(findings)
                    if findings and verbose_findings:
                        for finding in findings:
                            bar.write(f"  trial {index}: {finding}", file=sys.stderr)
                    bar.set_postfix(findings=len(tally.findings))
                bar.close()
                if stack.restarts:
                    self.stderr.write(f"{chosen_scenario.name}: {len(stack.restarts)} worker/beat restart(s) by the "
                                      f"watchdog: {'; '.join(stack.restarts[:5])}")
        for scenario_skipped in skipped:
            self.stderr.write(f"scenario {scenario_skipped.number}/{scenario_skipped.name}: SKIPPED on "
                              f"{connection.vendor} (needs PostgreSQL: it drops database connections mid-commit); "
                              "not counted in trials")
        if notes:
            self.stderr.write(f"{len(notes)} note(s), not findings:")
            for note in notes[:20]:
                self.stderr.write(f"  {note}")
        if tally.findings and not verbose_findings:
            for finding in tally.findings[:20]:
                self.stderr.write(f"  {finding}")
        self.stdout.write(tally.summary())
        if not tally.ok:
            sys.exit(1)
