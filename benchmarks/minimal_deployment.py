"""The benchmark's anchor: the least a Serve deployment of an ONNX model can be (no validation, no batching)."""

import numpy as np
import onnxruntime as ort
from ray import serve
from starlette.requests import Request

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}


@serve.deployment
class MinimalOnnx:
    def __init__(self, path: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        feeds = {t["name"]: np.asarray(t["data"], DTYPES[t["datatype"]]).reshape(t["shape"]) for t in body["inputs"]}
        names = [output.name for output in self.session.get_outputs()]
        outputs = self.session.run(names, feeds)
        return {
            "outputs": [
                {"name": n, "shape": list(o.shape), "data": o.ravel().tolist()}
                for n, o in zip(names, outputs, strict=True)
            ]
        }
