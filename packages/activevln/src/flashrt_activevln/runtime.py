"""Batched episode replay.

B rows, each replaying one episode: one reply per frame, the whole history (earlier frames and
replies) kept in that row's KV. When an episode ends, the next waiting one takes its row from
slot 0; nothing is cleared, since a row's query never sees a slot past its own tokens.

One forward per step for all rows: a row that starts a turn feeds its pending tokens and the turn
(prefill: its frame's vision embeddings scattered into the image tokens); a row inside a reply
feeds its last token. Either way the row's draft tree (grammar trie, ``grammar_tree_budget``
nodes) rides along after it; the accepted nodes' K/V are moved down behind the committed prefix
at the start of the next step's forward (incremental commit: only the accepted nodes are copied,
inside the next step's graph with ``cuda_graphs``; the last step's at the end of ``replay``).

Vision ahead (``vision_ahead=N``): a replay knows every frame before the model sees it, so after a
step's text forward is launched the engine runs the vision tower over frames the rows will need
next (up to N per row, and the waiting episodes' first frames; at most ``batch_size`` a call,
which frames share a call fixed by the replay alone) while the host waits for the step's choices
and accepts them. The embeddings wait in a cache until their frame's turn; a step whose frames
are all cached runs no vision of its own. The GPU fills the host's gap between two forwards with
work it needed anyway (waiting for larger vision calls instead lost: docs/activevln.md). With
``vision_stream`` the vision ahead runs on a CUDA stream of its own (after the work queued before
it): the next forward waits for a call only where it takes one of that call's frames, so a call
that outlasts the host's gap overlaps the next forward instead of delaying it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from flashrt_activevln.frames import FrameFeed, Loaded, load_frame
from flashrt_activevln.grammar import GrammarTrie, Node, parse_actions
from flashrt_activevln.graphs import (
    StepGraphs,
    VisionGraphs,
    all_buckets,
    buckets,
    step_forward,
)
from flashrt_activevln.model import Ops, Qwen25VL
from flashrt_activevln.presets import Options
from flashrt_activevln.processor import ActiveVLNProcessor
from flashrt_activevln.speculation import (
    constrain,
    sample_plain,
    verify_greedy,
    verify_sample,
)
from flashrt_activevln.staging import StageClock, Staging


@dataclass
class Episode:
    id: str
    instruction: str
    frames: list  # uint8 HxWx3 arrays, or image file paths read when needed


@dataclass
class Reply:
    episode: str
    frame: int
    row: int
    tokens: list[int]
    text: str
    actions: list
    forwards: int


@dataclass
class _Row:
    episode: Episode
    seed: int
    frame: int = 0
    length: int = 0  # committed KV slots
    pos: int = 0  # next M-RoPE position
    next_pos: int = 0  # the position after this step's chain
    pending: list[int] = field(default_factory=list)
    starting: bool = True  # the next forward starts a turn
    node: Node | None = None
    reply: list[int] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    forwards: int = 0
    generator: torch.Generator | None = None


@dataclass
class Stats:
    frames: int = 0
    replies_forwards: int = 0
    forwards: int = 0
    draft_nodes: int = 0  # draft nodes verified, over all forwards and rows
    vision_calls: int = 0  # vision tower runs, and the frames of them that ran ahead
    vision_ahead_frames: int = 0
    graph_captures: int = 0  # new CUDA graphs (``cuda_graphs``) and the seconds they took
    capture_seconds: float = 0.0
    seconds: dict = field(
        default_factory=lambda: {"preprocess": 0.0, "vision": 0.0, "prefill": 0.0, "decode": 0.0}
    )

    def as_dict(self) -> dict:
        fr = max(self.frames, 1)
        total = sum(self.seconds.values())
        return {
            "frames": self.frames,
            "forwards": self.forwards,
            "decode_forwards_per_reply": self.replies_forwards / fr,
            "draft_nodes_per_forward": self.draft_nodes / max(self.forwards, 1),
            "frames_per_vision_call": self.frames / max(self.vision_calls, 1),
            "vision_ahead_frames": self.vision_ahead_frames,
            "frames_per_second": self.frames / total if total else 0.0,
            "ms_per_frame": {k: 1000 * v / fr for k, v in self.seconds.items()},
            "graph_captures": self.graph_captures,
            "capture_seconds": self.capture_seconds,
        }


def uses_bit_rows(options: Options) -> bool:
    """Whether steps send their mask as each row's causal chain and its tree's bit rows (the
    ``gqa`` and ``gqa_invariant`` kernels over the packed forward with trees of 1..64 nodes)
    instead of a bool ``[B, Q, Q]`` mask: nothing quadratic in the step's queries is built,
    uploaded, or read per score by the attention tiles. The query-invariant launches get theirs
    from ``ops.invariant_steps``; their bits are the bool mask's (tests/activevln/test_lossless.py,
    run on an H200 2026-12-06)."""
    return (options.attention_kernel in ("gqa", "gqa_invariant") and options.packed_prefill
            and 0 < options.grammar_tree_budget <= 64)  # fmt: skip


class Engine:
    def __init__(self, model: Qwen25VL, processor: ActiveVLNProcessor, options: Options):
        self.model, self.proc, self.opt = model, processor, options
        self.bit_rows = uses_bit_rows(options)
        cfg = model.cfg
        self.eos = cfg.eos_token_ids[0]
        self.eos_set = set(cfg.eos_token_ids)
        self.trie = GrammarTrie.from_tokenizer(processor.tok, options.dataset, self.eos)
        self.sampling = options.sampling
        self.pool = None
        self.staging = Staging(model.device)
        self.stats = Stats()
        self.on_reply = None  # optional callback(Reply)
        self._children: torch.Tensor | None = None  # the trie's children table, on the device
        self.graphs: StepGraphs | None = None  # captured text steps of the current pool
        self._moves: list = []  # the last step's KV commit, applied by the next step's forward
        self.vision_graphs = VisionGraphs(model, processor)
        self.frames: FrameFeed | None = None  # the running replay's frame loader
        self._queue: deque = deque()  # the running replay's waiting episodes
        # (episode index, frame) -> (merged image embeddings, frame height, width, the event of
        # the call that made them on the vision stream or None): vision ahead
        self._embeds: dict[tuple[int, int], tuple[torch.Tensor, int, int, object]] = {}
        self._vision_stream = None  # ``vision_stream``: the vision ahead's CUDA stream
        self._unbooked: tuple | None = None  # the last step's clock, read after the next read

    @staticmethod
    def ops_for(options: Options) -> Ops:
        return Ops(
            rms_norm="kernel" if options.rms_norm_kernel else "reference",
            attention=options.attention_kernel,
            vision_attention=options.vision_kernel,
            decode_linear=options.decode_linear,
            prefill_linear=options.prefill_linear,
            activation="kernel" if options.swiglu_kernel else "reference",
        )

    def _extents(self, episodes: list[Episode]) -> tuple[int, int, set]:
        """(KV slots the longest episode needs, most queries a row feeds in one step, frame
        sizes); frames are assumed to share their episode's first frame's size."""
        need, widest, sizes = 0, 0, set()
        extra = self.opt.max_new_tokens + 2
        for ep in episodes:
            h, w = load_frame(ep.frames[0]).shape[:2]
            sizes.add((h, w))
            first = len(self.proc.turn(ep.instruction, True, h, w).ids)
            later = len(self.proc.turn(ep.instruction, False, h, w).ids)
            need = max(need, first + extra + (len(ep.frames) - 1) * (later + extra))
            widest = max(widest, first, later)
        return need, widest + self.opt.grammar_tree_budget + 2, sizes

    def capacity(self, episodes: list[Episode]) -> int:
        """KV slots per row: the longest episode plus one step's padded queries (rounded up to
        the graphs' query bucket)."""
        need, queries, _ = self._extents(episodes)
        return need + buckets(1, queries, 1)[1]

    def _ensure_pool(self, need: int) -> None:
        if self.pool is None or self.pool.capacity < need:
            self._flush_moves()
            self.pool, self.graphs = None, None
            self.pool = self.model.new_pool(self.opt.batch_size, need)

    def capture_graphs(self, episodes: list[Episode], capacity: int | None = None) -> int:
        """With ``cuda_graphs`` on a GPU: captures ahead of a replay of ``episodes`` every text
        step bucket and vision-tower image count that replay can meet (over the KV pool made
        for it), so the replay itself captures nothing. Returns how many graphs it captured
        (a few seconds for the 3B model at B=8)."""
        if not (self.opt.cuda_graphs and self.model.device.type == "cuda"):
            return 0
        _, queries, sizes = self._extents(episodes)
        self._ensure_pool(capacity or self.capacity(episodes))
        b = self.opt.batch_size
        merge = self.model.cfg.vision.spatial_merge_size**2
        image_rows = b * max(math.prod(self.proc.grid(h, w)) // merge for h, w in sizes)
        if self.graphs is None or self.graphs.image.shape[0] < image_rows:
            self.graphs = self._new_graphs(image_rows)
        chains = self.opt.attention_kernel == "gqa_invariant"
        new = self.graphs.capture_all(all_buckets(b, queries), self.opt.constrain_to_grammar,
                                      chains, self.bit_rows)  # fmt: skip
        vg = self.vision_graphs
        patch_dim = self.model.w["visual.patch_embed.proj.weight"][0].numel()
        for h, w in sorted(sizes):
            grid = self.proc.grid(h, w)
            for k in range(1, b + 1):
                if self.opt.gpu_preprocess and ("frames", k, h, w) not in vg.graphs:
                    vg.run_frames([torch.zeros((h, w, 3), dtype=torch.uint8)] * k)
                    new += 1
                elif not self.opt.gpu_preprocess and tuple([tuple(grid)] * k) not in vg.graphs:
                    pix = torch.zeros(k * math.prod(grid), patch_dim, device=self.model.device)
                    vg.run(pix, [grid] * k)
                    new += 1
        return new

    def _new_graphs(self, image_rows: int = 0) -> StepGraphs:
        children = self._allowed_table() if self.opt.constrain_to_grammar else None
        b, budget = self.opt.batch_size, self.opt.grammar_tree_budget
        return StepGraphs(self.model, self.pool, self.staging, b * (1 + budget), b * budget,
                          children, not self.sampling.do_sample, image_rows)  # fmt: skip

    def _flush_moves(self) -> None:
        """Applies the last step's pending KV commit now (at the end of a replay)."""
        if self.pool is not None and self._moves:
            self.pool.commit(self._moves)
        self._moves = []

    def release_row(self, row: int) -> None:
        """Called when a row's episode ends (a hook for tests)."""

    def replay(self, episodes: list[Episode], capacity: int | None = None) -> list[Reply]:
        """Replays ``episodes`` over ``batch_size`` rows. The KV pool (and the CUDA graphs that
        hold its addresses) is kept from the last replay when it has room for ``capacity`` slots
        per row (default: what these episodes need)."""
        b = self.opt.batch_size
        self._ensure_pool(capacity or self.capacity(episodes))
        queue = self._queue = deque(enumerate(episodes))
        rows: list[_Row | None] = [None] * b
        out: list[Reply] = []

        def fill():
            for r in range(b):
                if rows[r] is None and queue:
                    idx, ep = queue.popleft()
                    g = torch.Generator().manual_seed(self.opt.seed * 100003 + idx)
                    rows[r] = _Row(ep, seed=idx, node=self.trie.root, generator=g)
            # every row's next frames (as many as the vision ahead may take), and the first of
            # the next waiting episodes; a frame embedded ahead was taken already
            for row in rows:
                if row is not None:
                    first = row.frame + (0 if row.starting else 1)
                    for i in range(first, first + max(1, self.opt.vision_ahead)):
                        if (row.seed, i) not in self._embeds:
                            feed.want(row.episode, i)
            for idx, ep in itertools.islice(queue, b):
                if (idx, 0) not in self._embeds:
                    feed.want(ep, 0)

        with self._feed() as feed:
            self.frames = feed
            fill()
            while any(rows):
                self._step(rows, out)
                for r in range(b):
                    row = rows[r]
                    if row is not None and row.frame == len(row.episode.frames):
                        rows[r] = None
                        self.release_row(r)
                fill()
        self.frames = None
        self._embeds.clear()
        self._join_vision_stream()
        self._book()
        self._flush_moves()
        return out

    def _feed(self) -> FrameFeed:
        """The replay's frame loader: frames pinned for a non-blocking upload when the GPU
        preprocesses them, run through the CPU processor on its workers when it does not."""
        if not self.opt.gpu_preprocess:
            return FrameFeed(prepare=self.proc.preprocess_cpu)
        return FrameFeed(pinned=self.model.device.type == "cuda")

    def _room(self, row: _Row) -> int:
        """Draft nodes the row may verify: the tree budget, less what the reply has left."""
        room = self.opt.max_new_tokens - len(row.reply) - 1
        return min(self.opt.grammar_tree_budget, max(room, 0))

    def _drafts(self, row: _Row) -> tuple[list[Node], list[int]]:
        if self.opt.grammar_step_budget:
            return [], []  # drafted for all rows at once (``_step``)
        return self.trie.draft(row.node, self._room(row))

    def _pixels(self, frames: list[Loaded], dev: torch.device):
        """The step's new frames -> (pixel_values pieces on ``dev`` in row order, one grid per
        frame). ``gpu_preprocess``: each run of consecutive frames of one size is uploaded (from
        pinned memory, non-blocking, on a GPU) and preprocessed as one batch; else the frames
        come preprocessed by the CPU processor on the feed's workers."""
        pix, grids = [], []
        if not self.opt.gpu_preprocess:
            for frame in frames:
                pv, grid = frame.data
                pix.append(pv.to(dev))
                grids.append(grid)
            return pix, grids
        i = 0
        size = [(f.height, f.width) for f in frames]
        while i < len(frames):
            j = i + 1
            while j < len(frames) and size[j] == size[i]:
                j += 1
            if dev.type == "cuda":
                batch = torch.empty((j - i, *size[i], 3), dtype=torch.uint8, device=dev)
                for k in range(i, j):
                    batch[k - i].copy_(frames[k].data, non_blocking=True)
            else:
                batch = torch.from_numpy(np.stack([f.data for f in frames[i:j]]))
            pv, grid = self.proc.gpu_preprocess_batch(batch)
            pix.append(pv)
            grids.extend([grid] * (j - i))
            i = j
        return pix, grids

    def _join_vision_stream(self) -> None:
        """The current stream waits for the vision stream's work (its calls share the vision
        graphs' static buffers with the calls on the current stream)."""
        if self._vision_stream is not None:
            torch.cuda.current_stream(self.model.device).wait_stream(self._vision_stream)

    def _run_vision_ahead(self, keys: list[tuple[int, int]], frames: list[Loaded]) -> None:
        """One vision call of the vision ahead: on the current stream, or with ``vision_stream``
        on the vision stream after the work queued so far (the step's forward and the copy of
        its choices), its embeddings tagged with the call's completion event."""
        dev = self.model.device
        if not (self.opt.vision_stream and dev.type == "cuda"):
            self._run_vision(keys, frames)
            return
        if self._vision_stream is None:
            self._vision_stream = torch.cuda.Stream(dev)
        self._vision_stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self._vision_stream):
            self._run_vision(keys, frames)
            done = torch.cuda.Event()
            done.record()
        for key in keys:
            self._embeds[key] = (*self._embeds[key][:3], done)

    def _run_vision(self, keys: list[tuple[int, int]], frames: list[Loaded],
                    clock: StageClock | None = None) -> None:  # fmt: skip
        """The vision tower over ``frames`` (one call, on the current stream) -> each frame's
        merged embeddings into the cache under its key. ``clock`` is marked where preprocessing
        ends (before the tower, or before the vision graph that holds the preprocessing)."""
        dev, vg = self.model.device, self.vision_graphs
        before = (len(vg.graphs), vg.capture_seconds)
        one_size = len({(f.height, f.width) for f in frames}) == 1
        if self.opt.cuda_graphs and self.opt.gpu_preprocess and one_size:
            if clock is not None:
                clock.mark()
            image, _ = vg.run_frames([f.data for f in frames])
            grids = [self.proc.grid(f.height, f.width) for f in frames]
        else:
            pix, grids = self._pixels(frames, dev)
            if clock is not None:
                clock.mark()
            run = vg.run if self.opt.cuda_graphs else self.model.vision
            image = run(torch.cat(pix), grids)
        self.stats.graph_captures += len(vg.graphs) - before[0]
        self.stats.capture_seconds += vg.capture_seconds - before[1]
        self.stats.vision_calls += 1
        if self.opt.cuda_graphs:
            image = image.clone()  # a graph's static output: the next replay overwrites it
        merge = self.model.cfg.vision.spatial_merge_size**2
        sizes = [math.prod(g) // merge for g in grids]
        for key, f, emb in zip(keys, frames, image.split(sizes), strict=True):
            self._embeds[key] = (emb, f.height, f.width, None)

    def _ahead(self, rows: list[_Row | None], consumed: bool) -> bool:
        """Vision ahead (``vision_ahead``): the frames the rows need next that are not yet
        embedded, nearest first, at most ``batch_size`` of them, in one vision call.
        ``consumed``: called before the step's acceptance, when a starting row's frame is already
        taken (after it, a starting row's own frame is the next it needs). Returns whether it
        ran one."""
        depth, feed = self.opt.vision_ahead, self.frames
        if not depth or feed is None:
            return False
        live = [row for row in rows if row is not None]
        first = [row.frame + (1 if consumed or not row.starting else 0) for row in live]
        order = [(row.seed, row.episode, f + d)
                 for d in range(depth) for row, f in zip(live, first, strict=True)]  # fmt: skip
        # nearest first: every row's next frame, the waiting episodes' first frames, then the
        # rows' later frames
        waiting = itertools.islice(self._queue, self.opt.batch_size)
        order[len(live) : len(live)] = [(idx, ep, 0) for idx, ep in waiting]
        missing: dict[tuple[int, int], Episode] = {}  # in order, each frame once
        for idx, ep, i in order:
            if i < len(ep.frames) and (idx, i) not in self._embeds:
                missing.setdefault((idx, i), ep)
        wanted = list(missing.items())[: self.opt.batch_size]
        # taken in order, waiting for a load if need be, so that which frames share a call does
        # not depend on the loaders' timing; one frame size a call
        keys, frames = [], []
        for key, ep in wanted:
            frame = feed.take(ep, key[1])
            if frames and (frame.height, frame.width) != (frames[0].height, frames[0].width):
                self._run_vision_ahead([key], [frame])  # a frame of another size: its own call
                continue
            keys.append(key)
            frames.append(frame)
        if frames:
            self._run_vision_ahead(keys, frames)
        self.stats.vision_ahead_frames += len(wanted)
        return bool(wanted)

    def _book(self) -> None:
        """Books the last step's stage spans (its clock's last mark may trail the step's host read:
        the vision ahead; read once a later read has passed it, or at the end of a replay)."""
        if self._unbooked is None:
            return
        clock, prefill, tail, overlapped = self._unbooked
        self._unbooked = None
        pre, vis, text, *ahead = clock.spans()
        if overlapped:  # the vision ahead ran on the GPU while the host accepted: count it once
            tail = max(0.0, tail - sum(ahead))
        s = self.stats.seconds
        s["preprocess"] += pre
        s["vision"] += vis + sum(ahead)
        s["prefill" if prefill else "decode"] += text + tail

    def _step(self, rows: list[_Row | None], out: list[Reply]) -> None:
        dev = self.model.device
        clock = StageClock(dev)
        starting = [(r, row) for r, row in enumerate(rows) if row is not None and row.starting]
        keys, frames = [], []
        for _, row in starting:
            key = (row.seed, row.frame)
            if key not in self._embeds:
                keys.append(key)
                frames.append(self.frames.take(row.episode, row.frame))
            if (row.seed, row.frame + 1) not in self._embeds:
                self.frames.want(row.episode, row.frame + 1)  # loaded while this step runs
        if frames:
            self._join_vision_stream()
            self._run_vision(keys, frames, clock)
        else:
            clock.mark()
        turns, image = {}, None
        if starting:
            got = [self._embeds.pop((row.seed, row.frame)) for _, row in starting]
            stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
            for (r, row), (emb, h, w, done) in zip(starting, got, strict=True):
                turns[r] = self.proc.turn(row.episode.instruction, row.frame == 0, h, w)
                if done is not None:  # made on the vision stream: wait for that call
                    stream.wait_event(done)
                    emb.record_stream(stream)
            image = got[0][0] if len(got) == 1 else torch.cat([g[0] for g in got])
        clock.mark()  # the host builds the text step's inputs while the GPU runs the vision tower

        chains, chain_pos, drafts = [], [], []
        for r, row in enumerate(rows):
            if row is None:
                chains.append([0])
                chain_pos.append(torch.zeros(3, 1, dtype=torch.long))
                drafts.append(([], []))
                continue
            if row.starting:
                turn = turns[r]
                ids = row.pending + list(turn.ids)
                k = len(row.pending)
                lead = torch.arange(row.pos, row.pos + k).expand(3, k)
                pos = torch.cat([lead, turn.positions + row.pos + k], dim=1)
                row.next_pos = row.pos + k + turn.span
            else:
                ids = row.pending
                pos = torch.full((3, 1), row.pos, dtype=torch.long)
                row.next_pos = row.pos + 1
            chains.append(ids)
            chain_pos.append(pos)
            drafts.append(self._drafts(row))
        if self.opt.grammar_step_budget:  # one budget over the rows: the likeliest nodes
            live = [r for r, row in enumerate(rows) if row is not None]
            shared = self.trie.draft_rows([rows[r].node for r in live],
                                          [self._room(rows[r]) for r in live],
                                          self.opt.grammar_step_budget)  # fmt: skip
            for r, d in zip(live, shared, strict=True):
                drafts[r] = d
        host, verified = self._inputs(rows, turns, chains, chain_pos, drafts)
        self._moves = []  # applied by this step's forward
        extent = int(host["lengths"].max()) + host["ids"].shape[1]  # from the host: no read
        greedy = not self.sampling.do_sample
        if self.opt.cuda_graphs:
            if self.graphs is None:
                self.graphs = self._new_graphs()
            before = (len(self.graphs.graphs), self.graphs.capture_seconds)
            logits, choices = self.graphs.run(host, extent, image)  # one host-to-device copy
            self.stats.graph_captures += len(self.graphs.graphs) - before[0]
            self.stats.capture_seconds += self.graphs.capture_seconds - before[1]
        else:
            dv = self.staging.upload(host)  # the step's one host-to-device copy
            children = self._allowed_table() if "after" in dv else None
            logits, choices = step_forward(
                self.model, self.pool, dv, image, extent, children, greedy
            )
        self.stats.forwards += 1
        self.stats.draft_nodes += sum(len(d[0]) for d in drafts)
        clock.mark()  # before the step's host read, so that read completes it
        overlapped = choices is not None
        if overlapped:
            # greedy: the choices are copied behind the step and the vision ahead is queued behind
            # the copy, so the GPU runs it while the host waits for the copy and accepts
            read = choices[:verified]
            if read.is_cuda:
                host_read = torch.empty(verified, dtype=read.dtype, pin_memory=True)
                host_read.copy_(read, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record()
            if self._ahead(rows, consumed=True):
                clock.mark()
            if read.is_cuda:
                copied.synchronize()
                read = host_read
            choices = read.tolist()  # the step's one host read
        self._book()  # the step before's spans: complete now
        t_read = time.perf_counter()
        allowed = None
        if "after" in host and choices is None:
            allowed = self._allowed(host["after"].to(dev))
        moves, at = [], 0
        for r, row in enumerate(rows):
            if row is not None:
                n = 1 + len(drafts[r][0])
                if choices is not None:
                    picked = choices[at : at + n]
                else:
                    picked = logits[at : at + n]
                    if allowed is not None:
                        picked = constrain(picked, allowed[at : at + n])
                moves.append(self._verify(r, row, chains[r], drafts[r], picked, out))
                at += n
        self._moves = moves  # committed at the start of the next forward (or by ``replay``)
        tail = time.perf_counter() - t_read  # acceptance, on the host
        if not overlapped and self._ahead(rows, consumed=False):  # no read may wait for it here
            clock.mark()
        self._unbooked = (clock, bool(turns), tail, overlapped)

    def _inputs(self, rows, turns, chains, chain_pos, drafts) -> tuple[dict, int]:
        """The step's host tensors (padded to the graph buckets with ``cuda_graphs``) and the
        number of verified positions (each live row's last chain token and its nodes). Built
        in numpy: a step has hundreds of small row and node writes."""
        b = len(rows)
        q_lens = np.array([len(c) + len(d[0]) if row else 0
                           for row, c, d in zip(rows, chains, drafts, strict=True)])  # fmt: skip
        q = max(len(c) + len(d[0]) for c, d in zip(chains, drafts, strict=True))
        if self.opt.cuda_graphs:
            tokens, q = buckets(int(q_lens.sum()), q, b)
        ids_t = np.zeros((b, q), dtype=np.int64)
        pos_t = np.zeros((3, b, q), dtype=np.int64)
        if self.bit_rows:  # bit t of node i's row: node t is i or one of its ancestors
            tree_bits = np.zeros((b, q), dtype=np.uint64)
        else:
            vis = np.zeros((b, q, q), dtype=bool)
            vis[:, np.arange(q), np.arange(q)] = True  # padding sees only itself
            tri = np.tri(max(len(c) for c in chains), dtype=bool)
        img_mask = np.zeros((b, q), dtype=bool)
        verify, after = [], []
        for r, (chain, (nodes, parents)) in enumerate(zip(chains, drafts, strict=True)):
            c, n = len(chain), len(nodes)
            ids_t[r, :c] = chain
            if r in turns:
                k = c - len(turns[r].ids)
                img_mask[r, k:c] = np.asarray(turns[r].ids) == self.model.cfg.image_token_id
            pos_t[:, r, :c] = chain_pos[r].numpy()
            if not self.bit_rows:
                vis[r, :c, :c] = tri[:c, :c]
            if n:
                row = rows[r]
                ids_t[r, c : c + n] = [node.token for node in nodes]
                depth = np.array([node.depth for node in nodes])
                pos_t[:, r, c : c + n] = row.next_pos - 1 + depth - row.node.depth
                if self.bit_rows:
                    node_bits = tree_bits[r, c : c + n]
                    for i, parent in enumerate(parents):
                        node_bits[i] = (1 << i) | (int(node_bits[parent]) if parent >= 0 else 0)
                else:
                    tree = vis[r, c : c + n]  # a view: each node sees the chain and its ancestors
                    tree[:, :c] = True
                    for i, parent in enumerate(parents):
                        if parent >= 0:
                            tree[i] |= tree[parent]
            if rows[r] is not None:
                verify += [r * q + c - 1] + [r * q + c + i for i in range(n)]
                after += [rows[r].node] + nodes
        lengths = np.array([row.length if row else 0 for row in rows], dtype=np.int64)
        image_index = np.full((b, q), -1, dtype=np.int64)
        image_index[img_mask] = np.arange(int(img_mask.sum()))  # the image rows in row order
        host = {"ids": ids_t, "image_index": image_index, "pos": pos_t, "lengths": lengths}
        if self.bit_rows:
            host["tree_bits"] = tree_bits.view(np.int64)
        else:
            host["vis"] = vis
        size = b * self.opt.grammar_tree_budget if self.opt.cuda_graphs else None
        src, dst = self.pool.move_slots(self._moves, size)
        if src.size:
            host["move_src"], host["move_dst"] = src, dst
        verified = len(verify)
        if self.opt.cuda_graphs:  # fixed verified count: every row's chain token and a full tree
            verify += [0] * (b * (1 + self.opt.grammar_tree_budget) - verified)
            after += [None] * (len(verify) - verified)
        host["verify"] = np.array(verify, dtype=np.int64)
        if self.opt.constrain_to_grammar:
            gone = len(self.trie.nodes)  # the table's unconstrained row
            host["after"] = np.array([gone if n is None else n.index for n in after])
        if self.opt.packed_prefill:  # live tokens per row; empty rows do no work at all
            lens = q_lens.astype(np.int64)
            slot = np.arange(q)[None]
            live = (slot < lens[:, None]).reshape(-1).nonzero()[0]
            if self.opt.cuda_graphs and tokens > live.size:  # one non-live position repeated
                free = (slot >= lens[:, None]).reshape(-1).nonzero()[0][0]
                live = np.concatenate([live, np.full(tokens - live.size, free)])
            host["q_lens"] = lens
            host["live"] = live.astype(np.int64)
            if self.bit_rows or self.opt.attention_kernel == "gqa_invariant":  # causal chains
                host["chain"] = np.array([len(c) if row else 0
                                          for row, c in zip(rows, chains, strict=True)])  # fmt: skip
        return {k: torch.from_numpy(v) for k, v in host.items()}, verified

    def _allowed_table(self) -> torch.Tensor:
        """The trie's children table on the model's device (built once)."""
        if self._children is None:
            self._children = self.trie.children_table().to(self.model.device)
        return self._children

    def _allowed(self, after: torch.Tensor) -> torch.Tensor:
        """[R, C] child tokens of each verified position's trie node (-1 pads)."""
        return self._allowed_table()[after]

    def _verify(self, r, row: _Row, chain, draft, picked, out) -> tuple[int, int, list[int]]:
        """Acceptance for one row: ``picked`` is the greedy token list (after the root and each
        node) or, when sampling, the rows' logits. Returns the row's KV move (row, first new
        slot, accepted node indices) for ``KVPool.commit``."""
        nodes, parents = draft
        c = len(chain)
        tokens = [n.token for n in nodes]
        row.history += chain
        if not self.sampling.do_sample:
            acc, bonus = verify_greedy(picked, tokens, parents)
        elif nodes:
            logits = picked if picked.dtype == torch.float64 else picked.float()
            acc, bonus = verify_sample(
                logits, tokens, parents, self.sampling, row.generator, row.history
            )
        else:
            logits = picked if picked.dtype == torch.float64 else picked.float()
            acc, bonus = [], sample_plain(logits[0], self.sampling, row.generator, row.history)
        start = row.length + c
        row.length = start + len(acc)
        row.pos = row.next_pos + len(acc)
        row.forwards += 1
        row.starting = False
        accepted = [tokens[i] for i in acc]
        row.history += accepted
        emitted = accepted + [bonus]
        pending = [bonus]
        for k, t in enumerate(emitted):
            if t in self.eos_set:
                emitted = emitted[: k + 1]
                pending = [bonus] if k == len(accepted) else []
                break
        for t in emitted:
            row.node = self.trie.step(row.node, t)
        row.reply += emitted
        row.pending = pending
        done = emitted[-1] in self.eos_set
        if not done and len(row.reply) >= self.opt.max_new_tokens:
            row.pending = [bonus, self.eos]
            done = True
        if done:
            self._finish(r, row, out)
        return r, start, acc

    def _finish(self, r, row: _Row, out) -> None:
        body = [t for t in row.reply if t not in self.eos_set]
        text = self.proc.decode(body)
        rep = Reply(
            episode=row.episode.id,
            frame=row.frame,
            row=r,
            tokens=list(row.reply),
            text=text,
            actions=parse_actions(text, self.opt.dataset),
            forwards=row.forwards,
        )
        out.append(rep)
        if self.on_reply is not None:
            self.on_reply(rep)
        self.trie.observe(row.reply)
        self.stats.frames += 1
        self.stats.replies_forwards += row.forwards
        row.reply, row.forwards = [], 0
        row.frame += 1
        row.starting = True
        row.node = self.trie.root
