"""Celery tasks of runs: verification of tasks the agent claims are done."""

from __future__ import annotations

from celery import shared_task


def enqueue_verification(task_id: str) -> None:
    verify_task.apply_async(args=[task_id], queue="slow")


@shared_task(name="runs.verify_task", acks_late=True, reject_on_worker_lost=True)
def verify_task(task_id: str) -> str:
    from runs.verification import run_verification

    return run_verification(task_id)
