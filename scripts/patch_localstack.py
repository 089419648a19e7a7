"""Mends LocalStack 2026.3's Step Functions callback tasks
(`.waitForTaskToken` with `HeartbeatSeconds`) where they differ from AWS
in ways the chunk function meets when it answers quickly:

1. An answer that arrives before the task arms its heartbeat wait is
   lost: it notifies no heartbeat endpoint (there is none yet), and the
   wait then sleeps a whole heartbeat and reports a heartbeat timeout
   although the answer is there.
2. A retry of the task keeps its task token, and with it the answer of
   the attempt before: a heartbeat (which wakes the wait) makes the new
   attempt take the old answer.
3. A heartbeat that arrives before the task arms its heartbeat endpoint
   is refused as `InvalidToken`, although the task exists.

Mended: every answer is counted, and an attempt takes only an answer it
has not taken before (2); arming the heartbeat endpoint of a task with
such an answer waiting notifies it at once (1); an early heartbeat is
accepted (3: the task's wait starts afresh when it is armed).

Idempotent: each mend is applied once, found by its marker. Run by
`scripts/emulators.sh install` on the virtualenv's LocalStack.
"""

import pathlib
import sys

MARK = "# mediaonce: mended"

CALLBACK = "localstack/services/stepfunctions/asl/eval/callback/callback.py"
SERVICE = (
    "localstack/services/stepfunctions/asl/component/state/state_execution/"
    "state_task/service/state_task_service_callback.py"
)

MENDS = [
    (
        CALLBACK,
        """    def notify(self, outcome: CallbackOutcome):
        self._outcome = outcome
        self._notify_event.set()
        if self._heartbeat_endpoint:
            self._heartbeat_endpoint.notify()""",
        """    def notify(self, outcome: CallbackOutcome):
        self._outcome = outcome
        self._answers = getattr(self, "_answers", 0) + 1  %(mark)s
        self._notify_event.set()
        if self._heartbeat_endpoint:
            self._heartbeat_endpoint.notify()

    def fresh_outcome(self) -> CallbackOutcome | None:  %(mark)s
        # The answer an attempt has not taken yet: a retry keeps its token.
        if getattr(self, "_answers", 0) > getattr(self, "_taken", 0):
            return self._outcome
        return None

    def take_outcome(self) -> None:  %(mark)s
        self._taken = getattr(self, "_answers", 0)""",
    ),
    (
        CALLBACK,
        """    def setup_heartbeat_endpoint(self, heartbeat_seconds: int) -> HeartbeatEndpoint:
        self._heartbeat_endpoint = HeartbeatEndpoint(heartbeat_seconds=heartbeat_seconds)
        return self._heartbeat_endpoint""",
        """    def setup_heartbeat_endpoint(self, heartbeat_seconds: int) -> HeartbeatEndpoint:
        self._heartbeat_endpoint = HeartbeatEndpoint(heartbeat_seconds=heartbeat_seconds)
        if self.fresh_outcome() is not None:  %(mark)s
            self._heartbeat_endpoint.notify()
        return self._heartbeat_endpoint""",
    ),
    (
        CALLBACK,
        """    def notify_heartbeat(self) -> bool:
        if not self._heartbeat_endpoint:
            return False""",
        """    def notify_heartbeat(self) -> bool:
        if not self._heartbeat_endpoint:
            return True  %(mark)s""",
    ),
    (
        SERVICE,
        """            received = heartbeat_endpoint.clear_and_wait()
            if not received and env.is_running():  # Heartbeat timed out.
                outcome = HeartbeatTimedOut()
            else:
                outcome = callback_endpoint.get_outcome()""",
        """            received = heartbeat_endpoint.clear_and_wait()
            outcome = callback_endpoint.fresh_outcome()  %(mark)s
            if outcome is not None:
                callback_endpoint.take_outcome()
            elif not received and env.is_running():  # Heartbeat timed out.
                outcome = HeartbeatTimedOut()""",
    ),
]


def main(site_packages: str) -> int:
    root = pathlib.Path(site_packages)
    for relative, old, new in MENDS:
        new = new % {"mark": MARK}
        path = root / relative
        text = path.read_text()
        if new in text:
            continue
        if old not in text:
            print(f"patch_localstack: {relative} is not as expected; not mended", file=sys.stderr)
            return 1
        path.write_text(text.replace(old, new, 1))
        print(f"patch_localstack: mended {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
