"""Import first (before paddle) in a script that uses fleet's DistributedStrategy.

Paddle 2.6.2's DistributedStrategy reads ``FieldDescriptor.label``, which the newest protobuf
no longer has: its pure-python implementation keeps it as ``_label``. On Paddle 2.6 this selects
that implementation and adds the name back; on Paddle 3 it does nothing.
"""

import importlib.metadata
import os


def _paddle_version() -> str:
    for name in ("paddlepaddle", "paddlepaddle-gpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


if _paddle_version().startswith("2."):
    os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    from google.protobuf import descriptor

    if not hasattr(descriptor.FieldDescriptor, "label"):
        descriptor.FieldDescriptor.label = property(lambda self: self._label)
