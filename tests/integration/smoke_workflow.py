"""A trivial workflow for the Temporal smoke test (its own module: the sandbox re-imports it)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn
class SmokeWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(
            shout, text, start_to_close_timeout=timedelta(seconds=30)
        )
