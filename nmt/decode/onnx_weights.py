"""The initializers of an export's graphs as ONNX external data in one file, each distinct byte string once:
the graphs share most weights (encoder and step in both memory kinds), so embedding them made the folder ~5x
the weights, and onnxruntime held each graph's copy in memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from nmt.decode.onnx_graphs import OnnxExportError
from nmt.modelfile.onnx_folder import WEIGHTS

INLINE_BYTES = 1024             # smaller tensors stay in their graph (onnx's default size_threshold)
# Tensors from 1 MiB on start at a multiple of the largest allocation granularity (64 KiB), so that they can
# be memory-mapped; onnxruntime's own external-data writer aligns them so.
MAP_BYTES, GRANULARITY, ALIGNMENT = 1 << 20, 1 << 16, 64


def share_weights(folder: Path, files: Iterable[str]) -> None:
    """Move the initializers of the graphs `files` in `folder` into `folder`/WEIGHTS."""
    import onnx
    from onnx.external_data_helper import set_external_data
    from onnx.numpy_helper import from_array, to_array

    offsets: dict[bytes, int] = {}                      # sha256 of a tensor's bytes -> its offset
    with open(folder / WEIGHTS, "wb") as out:
        for name in files:
            try:
                model = onnx.load(str(folder / name))
            except Exception as exc:    # protobuf's DecodeError and others
                raise OnnxExportError(f"the exported {name} is not an ONNX graph ({exc}); this model cannot be "
                                      "exported to ONNX by this nmt") from None
            for tensor in model.graph.initializer:
                if not tensor.HasField("raw_data"):     # typed fields (int32_data, ...) as raw bytes
                    tensor.CopyFrom(from_array(to_array(tensor), tensor.name))
                data = tensor.raw_data
                if len(data) < INLINE_BYTES:
                    continue
                key = hashlib.sha256(data).digest()
                if key not in offsets:
                    align = GRANULARITY if len(data) >= MAP_BYTES else ALIGNMENT
                    out.write(bytes(-out.tell() % align))
                    offsets[key] = out.tell()
                    out.write(data)
                set_external_data(tensor, WEIGHTS, offsets[key], len(data))
                tensor.ClearField("raw_data")
            (folder / name).write_bytes(model.SerializeToString())
