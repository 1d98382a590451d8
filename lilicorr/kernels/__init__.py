"""Kernels (Triton on CUDA, compiled or oneDNN on CPU), each beside its plain-torch reference. Never imports Ray, DeepSpeed or MLflow.

    topk_logsoftmax.py   TopKLogProbs, topk_logsoftmax_reference (differentiable), topk_logsoftmax
                         (dispatch) -- the drafter's candidate pool and its 5 features (App. A)
    lattice.py           lattice_scores_reference, greedy_walk_reference, viterbi_reference,
                         match_and_walk (dispatch) -- Eq. 1, 8, 12
    gemv.py              gemv_reference (F.linear), gemv (compiled one-row reduction, CPU)
    packed_linear.py     PackedWeight, packed_linear, PackedLinear / pack_linears (oneDNN on prepacked fp32 CPU weights)
    linear.py            Projection: one weight and the kernel each call takes (GEMV, packed, F.linear)
    compiled.py          Compiled: an Inductor-compiled CPU function with its thread count (one_row_layer, heads)
    scripted.py          TorchScript helpers of the scripted CPU paths
    native/              a C kernel (the LiLiCorr head's batch-1 proposal), built by the machine's compiler on first use
    *_triton.py          the kernels (import triton; loaded lazily by the dispatchers)
    dispatch.py          Triton on CUDA tensors, or on CPU under TRITON_INTERPRET=1; else reference
    aot_check.py         compile a kernel for sm_90 without a GPU (tests)
    bench.py             `python jobs/bench.py kernels`
    bench_gemv.py        `python jobs/bench.py gemv`

Importing this package (or the reference modules) does not import triton.
"""
