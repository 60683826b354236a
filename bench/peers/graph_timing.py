"""Per-call time of a peer's kernels the way splice's C++ benches time theirs: one call per input
set captured in one CUDA graph, the graph replayed after warm-up, median replay / sets.

`graph_us(call, sets, warm_ms)`: call(s) for every s in `sets` is run twice outside capture on a
side stream (JIT compiles and autotuning happen there), then captured in one graph; the graph is
replayed for at least `warm_ms` of warm-up, then `replays` times, each timed with CUDA events.
Returns the median replay's time divided by len(sets), in microseconds.
"""
import torch

WARMUP, REPLAYS = 3, 21


def graph_us(call, sets, warm_ms, warmup=WARMUP, replays=REPLAYS):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets[:2]:
            call(s)  # compile / autotune outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in sets:
            call(s)
    w0 = torch.cuda.Event(enable_timing=True)
    w1 = torch.cuda.Event(enable_timing=True)
    w0.record()
    while True:
        for _ in range(warmup):
            graph.replay()
        w1.record()
        w1.synchronize()
        if w0.elapsed_time(w1) >= warm_ms:
            break
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    del graph
    return times[len(times) // 2] * 1e3 / len(sets)
