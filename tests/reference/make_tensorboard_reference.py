#!/usr/bin/env python3
"""The TensorBoard reference of tests/cpu/test_tensorboard.cpp, written by the `tensorboard` package.

Writes testdata/tensorboard/events.out.tfevents.1700000000.reference with tensorboard's own
EventFileWriter (its first event, file_version "brain.Event:2", at a fixed wall time) followed by
the scalar events listed in testdata/tensorboard/reference_events.json, each an Event whose summary
holds one Summary.Value{tag, simple_value}, the form of torch's SummaryWriter.add_scalar. kiln's
encoder must reproduce those records byte for byte.

With --read DIR it instead loads the event files in DIR with tensorboard's EventAccumulator (what
TensorBoard itself uses) and prints what it found: the test leaves a kiln-written file in
$KILN_TENSORBOARD_OUT when that is set.

Usage (a virtual environment of one's own):
  python3 -m venv /tmp/tbvenv && /tmp/tbvenv/bin/pip install tensorboard
  /tmp/tbvenv/bin/python tests/reference/make_tensorboard_reference.py
  KILN_TENSORBOARD_OUT=/tmp/kiln_tb build-cpu/tests/kiln_tests --gtest_filter='*TensorBoard*'
  /tmp/tbvenv/bin/python tests/reference/make_tensorboard_reference.py --read /tmp/kiln_tb
"""

import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "testdata" / "tensorboard"
FILE_VERSION_WALL_TIME = 1700000000.25
REFERENCE_NAME = "events.out.tfevents.1700000000.reference"

# Chosen to exercise the encoding: step 0 (left out of the Event), a negative step (a ten-byte
# varint), steps and a tag long enough for multi-byte varints, a value of 0 (still written: it is a
# oneof member), negative, tiny, huge, infinite and NaN values, wall times with fractions.
SCALARS = [
    {"tag": "loss", "step": 1, "value": 2.5, "wall_time": 1700000001.5},
    {"tag": "lr", "step": 1, "value": 1e-5, "wall_time": 1700000001.5},
    {"tag": "grad_norm", "step": 1, "value": 1.2345678, "wall_time": 1700000001.5},
    {"tag": "tokens_per_s", "step": 1, "value": 12345.6, "wall_time": 1700000001.5},
    {"tag": "loss", "step": 0, "value": 3.0, "wall_time": 1700000000.75},
    {"tag": "loss", "step": 2, "value": 0.0, "wall_time": 1700000002.125},
    {"tag": "val_loss", "step": 300, "value": -0.75, "wall_time": 1700000003.0},
    {"tag": "train/loss", "step": 123456789012, "value": 3.4e38, "wall_time": 1700000004.0625},
    {"tag": "x" * 200, "step": -1, "value": 1e-30, "wall_time": 1.0},
    {"tag": "inf", "step": 5, "value": "inf", "wall_time": 1700000005.0},
    {"tag": "nan", "step": 6, "value": "nan", "wall_time": 1700000006.0},
]


def as_float(v):
    return float(v) if isinstance(v, str) else v


def write_reference():
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # The writer stamps its first event (and its file name) with time.time(): fix it.
        with mock.patch("time.time", return_value=FILE_VERSION_WALL_TIME):
            writer = EventFileWriter(tmp)
        for s in SCALARS:
            value = summary_pb2.Summary.Value(tag=s["tag"], simple_value=as_float(s["value"]))
            event = event_pb2.Event(wall_time=s["wall_time"], step=s["step"],
                                    summary=summary_pb2.Summary(value=[value]))
            writer.add_event(event)
        writer.close()
        (written,) = [p for p in Path(tmp).iterdir() if "tfevents" in p.name]
        shutil.copyfile(written, OUT_DIR / REFERENCE_NAME)
    manifest = {
        "about": "the events of " + REFERENCE_NAME + ", written by tests/reference/make_tensorboard_reference.py",
        "file_version_wall_time": FILE_VERSION_WALL_TIME,
        "writer": "tensorboard.summary.writer.event_file_writer",
        "scalars": SCALARS,
    }
    (OUT_DIR / "reference_events.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print("wrote", OUT_DIR / REFERENCE_NAME, (OUT_DIR / REFERENCE_NAME).stat().st_size, "bytes")


def read_back(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(p.name for p in Path(path).iterdir() if "tfevents" in p.name)
    print("event files:", files)
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    print("file_version:", acc.file_version)
    tags = acc.Tags()["scalars"]
    print("scalar tags:", tags)
    for tag in tags:
        events = acc.Scalars(tag)
        shown = [(e.step, e.wall_time, e.value) for e in events[:4]]
        more = f" ... ({len(events)} in all, last {(events[-1].step, events[-1].value)})" if len(events) > 4 else ""
        print(f"  {tag}: {shown}{more}")
        for e in events:
            if not math.isfinite(e.value) and tag not in ("inf", "nan"):
                raise SystemExit(f"non-finite value read back for {tag} at step {e.step}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--read", metavar="DIR", help="read the event files in DIR with EventAccumulator and print them")
    args = ap.parse_args()
    if args.read:
        if not os.path.isdir(args.read):
            raise SystemExit(f"{args.read}: no such folder")
        read_back(args.read)
    else:
        write_reference()


if __name__ == "__main__":
    main()
