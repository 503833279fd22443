"""`--profile DIR`: a TensorFlow profiler trace and a Chrome timeline of a few measured steps.

Two files per input path, both from the same run:

- `DIR/<path>/plugins/profile/<time>/<host>.xplane.pb`, from
  `tf.profiler.experimental` (it works with graph-mode sessions in TF 2.21):
  open it with `tensorboard --logdir DIR` (Profile tab; needs the
  `tensorboard` and `tensorboard-plugin-profile` packages, which the
  project's venv does not install).
- `DIR/<path>/timeline.json`, the step's `RunMetadata` as a Chrome trace:
  open it in chrome://tracing or https://ui.perfetto.dev. No extra package.

Only one TensorFlow trace can run at a time, so the telemetry's sampled
tracing pauses while the profiler runs.
"""

from __future__ import annotations

import os

from tensorpack.callbacks import Callback

from frameworks.tf_env import import_tf

tf = import_tf()


class ProfileSteps(Callback):
    """Profiles `steps` steps from step `first` (after the timed windows), then traces one more into a timeline."""

    def __init__(self, logdir: str, first: int, steps: int = 3, telemetry=None) -> None:
        self.logdir = logdir
        self.first = first
        self.last = first + steps - 1  # inclusive
        self.timeline_step = self.last + 1
        self.telemetry = telemetry
        self.step = 0
        self.written: list[str] = []
        self._active = False

    def _before_run(self, ctx):
        if self.step == self.first:
            if self.telemetry is not None:
                self.telemetry.paused = True
            os.makedirs(self.logdir, exist_ok=True)
            tf.profiler.experimental.start(self.logdir)
            self._active = True
        if self.step == self.timeline_step:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            return tf.compat.v1.train.SessionRunArgs(fetches=[], options=options)
        return None

    def _after_run(self, ctx, values) -> None:
        if self._active and self.step == self.last:
            self._stop()
        if self.step == self.timeline_step and values.run_metadata is not None:
            from tensorflow.python.client import timeline

            path = os.path.join(self.logdir, "timeline.json")
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(timeline.Timeline(values.run_metadata.step_stats).generate_chrome_trace_format())
            os.replace(tmp, path)
            self.written.append(path)
        self.step += 1

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._active = False
        if self.telemetry is not None:
            self.telemetry.paused = False
        self.written.append(os.path.join(self.logdir, "plugins", "profile"))

    def _after_train(self) -> None:
        if self._active:  # the run ended inside the profiled steps
            self._stop()


def how_to_open(logdir: str) -> str:
    """What to type to look at a --profile folder (said honestly: what needs what)."""
    return (
        f"profile traces in {logdir}:\n"
        f"  tensorboard --logdir {logdir}    (Profile tab; needs: pip install tensorboard tensorboard-plugin-profile)\n"
        f"  {logdir}/<path>/timeline.json    (one step's op timeline: open in chrome://tracing or ui.perfetto.dev)"
    )
