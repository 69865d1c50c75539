"""CUDA graphs of the text step, one per token bucket, and of the vision tower, one per list of
image grids (the ``cuda_graphs`` option).

A step's text work (``step_forward``) is the previous step's incremental KV commit, the token
embedding with the step's image rows scattered in, the packed decoder forward over the live
tokens (``packed_prefill``), the LM head over the verified positions and the greedy choice: all
of it inside the graph, so nothing runs eagerly between a step's host read and its graph but the
copy of the vision tower's output into the graphs' image buffer. Its shapes are the live token
count ``T``, the padded query count ``Q``, the verified count ``R`` and the move count; the graph
for a step is the one of its buckets ``(T_b, Q_b)`` (``buckets``) with ``R`` and the moves
padded to their fixed maxima (every row's chain token plus a full tree; a full tree's depth of
moves per row). The first step of a bucket runs the work once eagerly (compilation, library
workspaces) and captures it: that eager run is the step (a step must run once: its commit
moves are not idempotent); later steps of that bucket copy their inputs from the host straight
into the graph's static input buffer (one transfer) and replay.

Padding: the extra ``T_b - T`` live-index entries all name one position that is not live (it
exists whenever padding is needed, since ``T_b <= B * Q_b``), so they write K/V only past that
row's live extent (never read) and the output at that position is unspecified; padded verified
positions repeat position 0 and their choices are ignored; padded moves repeat a real move (or
copy slot 0 onto itself). Graphs hold the addresses of the KV
pool and of the model's weights, so they belong to one pool (``Engine`` drops them with it).
On a CPU there is nothing to capture: the bucketed step runs eagerly (so the tests check the
padding on the CPU reference path).
"""

from __future__ import annotations

import time
from functools import cache

import torch

from flashrt_activevln.model.ops import FEW_QUERIES
from flashrt_activevln.speculation import greedy_choices
from flashrt_activevln.staging import layout, views

TOKEN_BUCKET = 64
# The token step doubles past each of these counts of ``TOKEN_BUCKET`` tokens: 64 up to 512
# tokens, 128 up to 1024, 256 beyond (at most 1/8 padding, and few graphs).
COARSER_PAST = (8, 16)
TEXT_PIECES = 4  # graphs per text step: the GPU starts on the first while the host submits the rest
VISION_PIECES = 4  # graphs per vision tower replay


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def buckets(tokens: int, queries: int, rows: int) -> tuple[int, int]:
    """(T_b, Q_b): queries to a power of two of at least ``FEW_QUERIES`` (so the few-query
    kernels are chosen exactly as the eager step chooses them), tokens to a multiple of
    ``TOKEN_BUCKET`` (the step doubled past each count in ``COARSER_PAST``), at most
    ``rows * Q_b``."""
    q_b = max(FEW_QUERIES, next_pow2(queries))
    tokens = max(tokens, 1)
    step = TOKEN_BUCKET
    for past in COARSER_PAST:
        if tokens > past * TOKEN_BUCKET:
            step *= 2
    t_b = -(-tokens // step) * step
    return min(t_b, rows * q_b), q_b


def all_buckets(rows: int, max_queries: int) -> list[tuple[int, int]]:
    """Every (T_b, Q_b) that ``buckets`` returns for steps of at most ``max_queries`` queries per
    row over ``rows`` rows (what ``StepGraphs.capture_all`` captures ahead of a replay)."""
    top = buckets(1, max_queries, rows)[1]
    found = set()
    q_b = FEW_QUERIES
    while q_b <= top:
        found.update(buckets(t, q_b, rows) for t in range(1, rows * q_b + 1))
        q_b *= 2
    return sorted(found, key=lambda k: (k[1], k[0]))


def splits(layers: int, pieces: int) -> frozenset[int]:
    """The layers after which a capture of ``layers`` layers in ``pieces`` pieces cuts (the
    pieces as even as the count allows)."""
    size = -(-layers // max(1, pieces))
    return frozenset(range(size - 1, layers - 1, size))


@cache
def _capture_stream(device: int) -> torch.cuda.Stream:
    """One capture stream per device for every capture (its library workspaces made once)."""
    return torch.cuda.Stream(device)


def _capture(pieces: list, pool, work, cuts: frozenset[int] = frozenset()) -> float:
    """Runs ``work(cut)`` once eagerly on the capture stream (kernel compilation, library
    workspaces, the caches it fills), then captures it into the CUDA graphs ``pieces`` in turn: ``work``
    calls ``cut(i)`` at each point where a piece may end, and the capture moves on to the next
    piece at the points in ``cuts`` (``len(cuts) == len(pieces) - 1``). Replaying the pieces in
    order replays the work; the GPU starts on the first piece while the host still submits the
    later ones. Captured in thread-local mode: the frame feed's workers may allocate pinned
    memory meanwhile. Returns the seconds it took."""
    if len(cuts) != len(pieces) - 1:
        raise ValueError(f"_capture: {len(pieces)} pieces need {len(pieces) - 1} cuts, got {cuts}")
    t0 = time.perf_counter()
    stream = _capture_stream(torch.cuda.current_device())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        work(lambda i: None)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    at = [0]

    def cut(i: int) -> None:
        if i in cuts:
            pieces[at[0]].capture_end()
            at[0] += 1
            pieces[at[0]].capture_begin(pool, capture_error_mode="thread_local")

    with torch.cuda.stream(stream):
        pieces[0].capture_begin(pool, capture_error_mode="thread_local")
        work(cut)
        pieces[at[0]].capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if at[0] != len(pieces) - 1:
        raise RuntimeError(f"_capture: the work cut {at[0] + 1} pieces, expected {len(pieces)}")
    return time.perf_counter() - t0


class VisionGraphs:
    """The vision tower replayed from one CUDA graph per list of image grids (``run``), or per
    count and size of uint8 frames with the GPU preprocessing captured in front of it
    (``run_frames``, with the processor's ``gpu_preprocess_batch``). Graphs hold
    only the weights' addresses and the model's cached vision plans, so they outlive KV pools.
    On a CPU the work runs eagerly."""

    def __init__(self, model, processor=None):
        self.model, self.processor = model, processor
        self.graphs: dict[tuple, tuple] = {}  # key -> (graph, input buffer, output holder)
        self.mempool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None
        self.capture_seconds = 0.0

    def _replay(self, key, example: torch.Tensor, work, fill) -> torch.Tensor:
        """``work(buf, after_block)`` from the graph pieces of ``key`` (captured on the first
        call), after ``fill(buf)`` has written the step's input into the static buffer."""
        entry = self.graphs.get(key)
        if entry is None:
            buf, out = torch.empty_like(example), {}
            fill(buf)
            cuts = splits(self.model.cfg.vision.depth, VISION_PIECES)
            pieces = [torch.cuda.CUDAGraph() for _ in range(len(cuts) + 1)]
            self.capture_seconds += _capture(
                pieces, self.mempool, lambda cut: out.update(x=work(buf, cut)), cuts
            )
            entry = self.graphs[key] = (pieces, buf, out)
        pieces, buf, out = entry
        fill(buf)
        for piece in pieces:
            piece.replay()
        return out["x"]

    def run(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Merged image embeddings (a static tensor, valid until the next call)."""
        if not pixels.is_cuda:
            return self.model.vision(pixels, grids)
        key = tuple(tuple(g) for g in grids)
        return self._replay(key, pixels, lambda buf, cut: self.model.vision(buf, grids, cut),
                            lambda buf: buf.copy_(pixels))  # fmt: skip

    def _frames_work(self, frames: torch.Tensor, cut=None) -> tuple[torch.Tensor, tuple]:
        pixels, grid = self.processor.gpu_preprocess_batch(frames)
        return self.model.vision(pixels, [grid] * frames.shape[0], cut), grid

    def run_frames(self, frames: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """uint8 [H, W, 3] host frames of one size (pinned: their copies are non-blocking) ->
        (the frames' merged image embeddings back to back, a static tensor valid until the next
        call; the grid of one frame). Each frame is copied straight into the graph's input."""
        h, w = frames[0].shape[:2]
        dev = self.model.device
        if dev.type != "cuda":
            return self._frames_work(torch.stack([torch.as_tensor(f) for f in frames]).to(dev))

        def fill(buf):
            for k, f in enumerate(frames):
                buf[k].copy_(f, non_blocking=True)

        key = ("frames", len(frames), h, w)
        example = torch.empty((len(frames), h, w, 3), dtype=torch.uint8, device=dev)
        out = self._replay(key, example, lambda buf, cut: self._frames_work(buf, cut)[0], fill)
        return out, self.processor.grid(h, w)


def step_forward(model, pool, x: dict, image, extent: int, children, greedy: bool,
                 after_layer=None):  # fmt: skip
    """One text step from its device inputs ``x`` (``Engine._inputs``' names): the previous
    step's incremental commit (``move_src`` / ``move_dst``, when present), the embedding with the
    image rows scattered in (``image`` [N, H] or None), the decoder over the KV pool, the LM head
    over the verified positions and, when ``greedy``, the greedy choices (among each verified
    position's grammar children when ``children`` is the trie's table). Fixed shapes and no host
    read: the eager step and the captured one run this same code (``after_layer``: the decoder's
    hook, where a capture may cut). -> (logits, choices or None)."""
    if "move_src" in x:
        pool.move(x["move_src"], x["move_dst"])
    b, q = x["ids"].shape
    embeds = model.embed_step(x["ids"], x["image_index"], image)
    mask = x["tree_bits"] if "tree_bits" in x else x["vis"]
    hidden = model.decode(
        embeds, x["pos"], pool, x["lengths"], mask, x.get("q_lens"), extent, x.get("live"),
        x.get("chain"), after_layer,
    )  # fmt: skip
    logits = model.logits(hidden.reshape(b * q, -1)[x["verify"]])
    if not greedy:
        return logits, None
    allowed = None if children is None else children[x["after"]]
    return logits, greedy_choices(logits, allowed)


class _Graph:
    """One bucket's graph and its static inputs: every input is a view of one device buffer at
    the offsets ``staging.layout`` gives the names in sorted order, so a step's inputs arrive
    with the step's one host-to-device copy straight into the buffer the graph reads."""

    def __init__(self, host: dict[str, torch.Tensor], device: torch.device):
        self.names = tuple(host)
        self.pieces = self.buffer = self.inputs = None
        if device.type == "cuda":
            spans, total = layout(host)
            self.pieces = []  # the CUDA graphs, made at capture (``splits``)
            self.buffer = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
            self.inputs = views(self.buffer, host, spans)
        self.logits: torch.Tensor | None = None
        self.choices: torch.Tensor | None = None


class StepGraphs:
    """Captured text steps of one engine and one KV pool. ``image`` is the static buffer the
    step's image rows are copied into (``image_rows`` rows, grown on demand, which drops the
    graphs that hold its old address)."""

    def __init__(self, model, pool, staging, max_verify: int, max_moves: int,
                 children: torch.Tensor | None, greedy: bool, image_rows: int = 0):  # fmt: skip
        self.model, self.pool, self.staging = model, pool, staging
        self.max_verify, self.max_moves = max_verify, max_moves
        self.children = children  # the trie's children table on the device (constrained)
        self.greedy = greedy
        hidden = model.cfg.text.hidden_size
        self.image = torch.zeros(image_rows, hidden, dtype=model.dtype, device=model.device)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.capture_seconds = 0.0  # eager first runs and captures of new buckets
        self.mempool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None

    def _work(self, g: _Graph, extent: int, cut=None) -> None:
        image = self.image if self.image.shape[0] else None  # (growing it drops the graphs)
        g.logits, g.choices = step_forward(
            self.model, self.pool, g.inputs, image, extent, self.children, self.greedy, cut
        )

    def _set_image(self, image: torch.Tensor) -> None:
        n = image.shape[0]
        if n > self.image.shape[0]:
            self.image = torch.zeros(n, self.image.shape[1], dtype=self.image.dtype,
                                     device=self.image.device)  # fmt: skip
            self.graphs.clear()
        self.image[:n].copy_(image)

    def run(self, host: dict[str, torch.Tensor], extent: int, image: torch.Tensor | None = None):
        """The step's host inputs at bucket shapes (``Engine._inputs``: ids, image_index, pos,
        lengths, vis or tree_bits, q_lens, live, verify, and after / chain / move_src / move_dst
        where the engine uses them) and its image rows (or None) -> (logits [R_max, V], choices
        [R_max] or None), static tensors valid until the next call."""
        host = {k: host[k] for k in sorted(host)}
        b, q_b = host["ids"].shape
        if image is not None:
            self._set_image(image)
        key = (host["live"].numel(), q_b)
        g = self.graphs.get(key)
        fresh = g is None
        if fresh:
            g = _Graph(host, self.image.device)
        elif g.names != tuple(host):
            raise ValueError(f"StepGraphs.run: inputs {list(host)}, the graph has {list(g.names)}")
        x = self.staging.upload(host, dest=g.buffer)
        if g.pieces is None:  # a CPU: nothing to capture, the bucketed step runs eagerly
            g.inputs = x
            self.graphs[key] = g
            self._work(g, extent)
            return g.logits, g.choices
        for name, t in x.items():
            if t.shape != g.inputs[name].shape:
                raise ValueError(
                    f"StepGraphs.run: {name} {tuple(t.shape)} in the bucket of "
                    f"{tuple(g.inputs[name].shape)}"
                )
        if fresh:
            # The step is not idempotent (the commit's moves may read slots an earlier move of the
            # same step wrote, and the new tokens' K/V may land on tree slots a move reads), so
            # it runs exactly once: the capture's eager run is this step, and its outputs are
            # returned; the capture itself runs nothing.
            cuts = splits(self.model.cfg.text.num_layers, TEXT_PIECES)
            g.pieces = [torch.cuda.CUDAGraph() for _ in range(len(cuts) + 1)]
            eager = []

            def work(cut):
                self._work(g, extent, cut)
                eager.append((g.logits, g.choices))

            self.capture_seconds += _capture(g.pieces, self.mempool, work, cuts)
            self.graphs[key] = g
            return eager[0]
        for piece in g.pieces:
            piece.replay()
        return g.logits, g.choices

    def capture_all(self, bucket_list: list[tuple[int, int]], constrained: bool,
                    chains: bool = False, bit_rows: bool = False) -> int:  # fmt: skip
        """Captures every bucket of ``bucket_list`` not captured yet, over placeholder inputs of
        the bucket's shapes (query lengths that fill ``T_b``, KV lengths 0: the K/V they write
        lie past every row's committed prefix, never read; no image rows; the moves copy slot 0
        onto itself), with the engine's input names: ``chains`` (each row's causal chain) and
        ``bit_rows`` (the mask as tree bit rows after the chains, not ``vis``). Returns how many
        were captured."""
        b = self.pool.k.shape[1]
        new = 0
        for t_b, q_b in bucket_list:
            if (t_b, q_b) in self.graphs:
                continue
            q_lens = torch.full((b,), t_b // b, dtype=torch.long)
            q_lens[: t_b % b] += 1
            live = (torch.arange(q_b)[None] < q_lens[:, None]).reshape(-1).nonzero()[:, 0]
            host = {
                "ids": torch.zeros(b, q_b, dtype=torch.long),
                "image_index": torch.full((b, q_b), -1, dtype=torch.long),
                "pos": torch.zeros(3, b, q_b, dtype=torch.long),
                "lengths": torch.zeros(b, dtype=torch.long),
                "q_lens": q_lens,
                "live": live,
                "verify": torch.zeros(self.max_verify, dtype=torch.long),
            }
            if constrained:
                host["after"] = torch.zeros(self.max_verify, dtype=torch.long)
            if bit_rows:
                host["tree_bits"] = torch.zeros(b, q_b, dtype=torch.long)
            else:
                host["vis"] = torch.eye(q_b, dtype=torch.bool).repeat(b, 1, 1)
            if chains or bit_rows:
                host["chain"] = q_lens.clone()
            if self.max_moves:
                host["move_src"] = torch.zeros(self.max_moves, dtype=torch.long)
                host["move_dst"] = torch.zeros(self.max_moves, dtype=torch.long)
            self.run(host, q_b)
            new += 1
        return new
