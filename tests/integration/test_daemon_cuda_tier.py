#!/usr/bin/python3
"""GPU test: the host-memory tier (DESIGN.md §4.10) on the CUDA backend —
pinned host pages, the copy stream and its events (gpu_worker/
gw_cuda_tier.c) — through the real tangramd: the checks of
test_daemon_tier.py's offload/restore case (gRPC and HTTP outputs after a
restore equal a never-offloaded CUDA daemon's, bit for bit in tokens;
usage's cached tokens; the tier's metrics; rewind of a restored entry;
scopes) with --backend cuda, --tp 1 and, with two GPUs, --tp 2. Exit 77
(skipped) without an NVIDIA GPU; fails naming any other missing input.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402
import test_daemon_tier as t  # noqa: E402


def main():
    if du.gpu_count() == 0:
        print("skip: no NVIDIA GPU (nvidia-smi -L lists none)")
        return du.SKIP
    missing = du.missing_inputs(
        programs=("tangramd", "tangram-router", "tangram-worker",
                  "tangram-make-model", "tangram-profile"),
        modules=(("grpc", "python3-grpcio"),
                 ("google.protobuf", "python3-protobuf")),
        tools=("protoc",))
    if missing:
        return du.fail_missing(missing)
    import grpc
    t.BACKEND = ["--backend", "cuda"]
    t.ELEM = 2
    work = du.scratch_dir("tgcudatier")
    try:
        pb = du.load_tangram_pb2(work)
        if not t.C.check(pb is not None, "protoc generates tangram_pb2"):
            return t.C.summary()
        model = du.make_model(os.path.join(work, "model"), t.MODEL_ARGS)
        prof = du.make_skewed_profile(work, 4, 2, 64, seed=3,
                                      heads_per_group=1)
        for tp in (1, 2) if du.gpu_count() >= 2 else (1,):
            ref = t.reference(grpc, pb, model, prof, work, tp)
            t.tier_case(grpc, pb, model, prof, work, tp, ref, kill=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return t.C.summary()


if __name__ == "__main__":
    sys.exit(main())
