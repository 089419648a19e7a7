"""Mends two races in LocalStack 2026.3's Step Functions callback tasks
(`.waitForTaskToken` with `HeartbeatSeconds`), which real Step Functions
does not have and which the chunk function meets when it answers quickly:

1. An answer that arrives before the task arms its heartbeat wait is
   lost: on the heartbeat timeout that follows, the wait reports the
   timeout even though the answer is there. Mended: after every wait the
   outcome is looked at first (such an answer is taken at the timeout).
2. A heartbeat that arrives before the task arms its heartbeat endpoint is
   refused as `InvalidToken`, although the task exists. Mended: it is
   accepted (the task's own wait starts afresh when it is armed).

Idempotent: each mend is applied once, found by its marker. Run by
`scripts/emulators.sh install` on the virtualenv's LocalStack.
"""

import pathlib
import sys

MARK = "# mediaonce: mended"

MENDS = [
    (
        "localstack/services/stepfunctions/asl/component/state/state_execution/"
        "state_task/service/state_task_service_callback.py",
        """            received = heartbeat_endpoint.clear_and_wait()
            if not received and env.is_running():  # Heartbeat timed out.
                outcome = HeartbeatTimedOut()
            else:
                outcome = callback_endpoint.get_outcome()""",
        """            received = heartbeat_endpoint.clear_and_wait()
            outcome = callback_endpoint.get_outcome()  %s
            if outcome is None and not received and env.is_running():  # Heartbeat timed out.
                outcome = HeartbeatTimedOut()"""
        % MARK,
    ),
    (
        "localstack/services/stepfunctions/asl/eval/callback/callback.py",
        """    def notify_heartbeat(self) -> bool:
        if not self._heartbeat_endpoint:
            return False""",
        """    def notify_heartbeat(self) -> bool:
        if not self._heartbeat_endpoint:
            return True  %s"""
        % MARK,
    ),
]


def main(site_packages: str) -> int:
    root = pathlib.Path(site_packages)
    for relative, old, new in MENDS:
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
