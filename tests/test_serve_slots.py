"""serve's slots (`--parallel N`): requests generated at once, their steps run as one batch of the kernel
(`runners.batched.BatchedRunner` over `NativeRunner.forward_batch`).

Every request gets the reply it gets alone (greedy and seeded, streaming or not, a JSON-schema request
beside free ones, through the real `openai` client, 16 at once), the steps really ran together (a
batch held several sequences), and a client that leaves mid-batch frees its slot at the next step while
the others' replies stay whole.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from chatcli.engine.engine import Finished
from chatcli.engine.sample.sampling import SamplingParams
from tests.servers import TIMEOUT, USER, alone
from tests.tiny import CHATML

PROMPTS = ["Hello", "café naïve", "def main():", "quick brown fox", "中文测试", "Emoji 🙂", "tabs\tand", "France?"]


@pytest.fixture
def native(tiny_loaded, kernel):
    """The tiny model on the compiled kernel (whose runner batches), fp32 cache."""
    from chatcli.engine.load.hf import build_engine

    return build_engine(tiny_loaded, runner="lean", kv_dtype="float32", kernel=True)


def request(i: int, prompt: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0 if i % 2 else 1.0, "seed": i}


def test_the_default_is_four_slots_where_the_kernel_batches_and_one_elsewhere(native, tiny_lean):
    from chatcli.server.worker import slots_for

    assert slots_for(native, None) == 4 and slots_for(tiny_lean, None) == 1 and slots_for(tiny_lean, 3) == 3


def test_sixteen_openai_clients_at_once_each_get_the_reply_they_get_alone(native, serve):
    from openai import OpenAI

    bodies = [request(i, PROMPTS[i % 8] + " " * (i // 8)) for i in range(16)]
    expected = [
        alone(native, b["messages"], temperature=b["temperature"], seed=b["seed"], max_tokens=20) for b in bodies
    ]
    server = serve(native, parallel=4)
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
    barrier = threading.Barrier(len(bodies))

    def run(i: int) -> str:
        barrier.wait(TIMEOUT)
        b = bodies[i]
        if i % 3 == 0:  # a third stream
            stream = client.chat.completions.create(model="tiny", max_tokens=20, stream=True, **b)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        return client.chat.completions.create(model="tiny", max_tokens=20, **b).choices[0].message.content

    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(run, range(len(bodies))))
    assert replies == expected
    runner = server.worker.engine.runner
    assert runner.widest > 1, "no step ran two requests together"
    assert server.worker.served == 16 and server.worker.running == 0
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).json()["slots"] == {"total": 4, "busy": 0}


def test_a_schema_request_beside_free_ones(native, serve):
    from chatcli.engine.params import ResponseFormat

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    constrained = alone(
        native, USER, temperature=0, max_tokens=24, response_format=ResponseFormat.json_schema(schema, "n")
    )
    free = [alone(native, [{"role": "user", "content": p}], temperature=0, max_tokens=24) for p in PROMPTS[:3]]
    server = serve(native, parallel=4)
    bodies = [{"messages": USER, "temperature": 0, "max_tokens": 24, "response_format": fmt}] + [
        {"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 24} for p in PROMPTS[:3]
    ]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda b: server.post(b).json()["choices"][0]["message"]["content"], bodies))
    assert replies == [constrained, *free]


def test_a_client_that_leaves_mid_batch_frees_its_slot_and_spares_the_others(native, serve):
    native.tokenizer.stop_ids = frozenset()  # replies that run their whole length
    expected = [alone(native, [{"role": "user", "content": p}], temperature=0, max_tokens=60) for p in PROMPTS[:3]]
    batched, alone_forward = native.runner.forward_batch, native.runner.forward

    def slow_batch(requests):  # ~4 ms a step: the leaver is far from its context's end when it leaves
        time.sleep(0.004)
        return batched(requests)

    def slow_forward(ids, cache):  # a batch of one (the leaver before the others come) as slow
        time.sleep(0.004)
        return alone_forward(ids, cache)

    native.runner.forward_batch, native.runner.forward = slow_batch, slow_forward
    server = serve(native, parallel=4)
    worker = server.worker
    body = {"messages": USER, "temperature": 0, "max_tokens": 100_000, "stream": True}

    def others() -> list[str]:
        bodies = [
            {"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 60} for p in PROMPTS[:3]
        ]
        with ThreadPoolExecutor(3) as pool:
            return list(pool.map(lambda b: server.post(b).json()["choices"][0]["message"]["content"], bodies))

    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
        ThreadPoolExecutor(1) as pool,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the endless one is running
        replies = pool.submit(others)
        deadline = time.monotonic() + TIMEOUT
        while worker.running < 4:  # all four slots busy: the leaver shares batches with the others
            assert time.monotonic() < deadline
            time.sleep(0.005)
    # the stream is closed here, mid-batch
    assert replies.result(TIMEOUT) == expected
    assert worker.wait_idle(30) and worker.running == 0 and worker.cancelled == 1
    after = server.post({"messages": USER, "temperature": 0, "max_tokens": 6}).json()
    assert after["choices"][0]["message"]["content"] == alone(native, USER, temperature=0, max_tokens=6)


def test_a_failing_sequence_fails_alone(native):
    """A batch that raises runs its calls one by one: only the bad one's turn fails."""
    from chatcli.engine.kv.pool import SessionPool
    from chatcli.server.worker import Failed, GenerationWorker, Job

    worker = GenerationWorker(native, SessionPool(native.new_session, 1 << 30), parallel=2)
    runner = worker.engine.runner
    batched, bad = runner.runner.forward_batch, 40  # a token id the tiny vocabulary reads, made to fail
    alone_forward = runner.runner.forward

    def failing_batch(requests):
        if any(bad in ids for ids, _cache, _every in requests):
            raise IndexError("bad id")
        return batched(requests)

    def failing_forward(ids, cache):
        if bad in ids:
            raise IndexError("bad id")
        return alone_forward(ids, cache)

    runner.runner.forward_batch, runner.runner.forward = failing_batch, failing_forward
    got: list[list] = [[], []]
    params = SamplingParams(temperature=0, max_tokens=12)
    good_ids = native.tokenizer.encode_chat(USER)
    assert worker.submit(Job([], params, got[0].append, prompt=good_ids))
    assert worker.submit(Job([], params, got[1].append, prompt=[*good_ids[:-1], bad]))
    assert worker.wait_idle(30)
    worker.close()
    runner.runner.forward_batch, runner.runner.forward = batched, alone_forward
    assert isinstance(got[1][-1], Failed) and got[1][-1].error.status == 500
    assert isinstance(got[0][-1], Finished)
    want = list(native.complete(good_ids, native.new_session(), params))[-1]
    assert got[0][-1].reply == want.reply


def test_a_long_prompt_goes_in_small_chunks_beside_a_running_turn(native):
    """Beside a running turn a prefill call takes at most SHARED_CHUNK prompt tokens (the other's steps
    ride in the same calls and wait for each), alone the engine's own chunk; the replies are unchanged."""
    from chatcli.engine.runners.batched import SHARED_CHUNK

    engine = native.batched()
    runner = engine.runner
    sizes: list[list[int]] = []
    batched = runner.runner.forward_batch

    def recording(requests):
        sizes.append([len(ids) for ids, _cache, _every in requests])
        return batched(requests)

    runner.runner.forward_batch = recording
    long_prompt = [{"role": "user", "content": "count: " + " ".join(str(i % 10) for i in range(90))}]
    assert len(native.tokenizer.encode_chat(long_prompt)) > SHARED_CHUNK
    params = SamplingParams(temperature=0, max_tokens=8, lookup=0)
    want_long = alone(native, long_prompt, temperature=0, max_tokens=8, lookup=0)
    want_short = alone(native, USER, temperature=0, max_tokens=40, lookup=0)
    started, replies = threading.Event(), {}

    def turn(name, messages, max_tokens):
        with runner.slot():
            for event in engine.generate(messages, engine.new_session(), params.with_(max_tokens=max_tokens)):
                started.set()
                if isinstance(event, Finished):
                    replies[name] = event.reply

    short = threading.Thread(target=turn, args=("short", USER, 40))
    short.start()
    assert started.wait(TIMEOUT)
    turn("long", long_prompt, 8)
    short.join(TIMEOUT)
    runner.runner.forward_batch = batched
    assert replies == {"long": want_long, "short": want_short}
    assert any(len(s) > 1 for s in sizes), "the two turns never shared a call"
    assert max(max(s) for s in sizes) <= SHARED_CHUNK


def test_a_follow_up_sent_the_moment_a_reply_ends_finds_its_cache(native, serve, monkeypatch):
    """The session goes back to the pool before the client hears the reply's end: a follow-up sent the
    moment the last chunk arrives, taken by another slot at once, continues the cached conversation (the
    pool's release is slowed, so a release after the end would come too late)."""
    from chatcli.engine.kv.pool import SessionPool

    release = SessionPool.release

    def slow_release(self, lease, ok=True):
        time.sleep(0.3)
        release(self, lease, ok)

    monkeypatch.setattr(SessionPool, "release", slow_release)
    server = serve(native, parallel=2)
    messages = [{"role": "user", "content": "France?"}]
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        first = http.post("/v1/chat/completions", json={"messages": messages, "temperature": 0, "max_tokens": 8})
        reply = first.json()["choices"][0]["message"]["content"]
        follow = messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And Italy?"}]
        second = http.post("/v1/chat/completions", json={"messages": follow, "temperature": 0, "max_tokens": 8})
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= first.json()["usage"]["prompt_tokens"]


def test_closing_the_worker_ends_the_step_thread(native):
    """A worker with slots runs its steps on a thread of the BatchedRunner's own; closing the worker ends
    it (after the calls it has), and a call after that is refused, not left waiting."""
    from chatcli.engine.kv.pool import SessionPool
    from chatcli.server.worker import GenerationWorker, Job

    worker = GenerationWorker(native, SessionPool(native.new_session, 1 << 30), parallel=2)
    got: list = []
    assert worker.submit(Job([], SamplingParams(temperature=0, max_tokens=4), got.append, prompt=[1, 2, 3]))
    assert worker.wait_idle(30) and isinstance(got[-1], Finished)
    step = worker.engine.runner._thread
    assert step is not None and step.is_alive()
    worker.close()
    assert not step.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        worker.engine.runner.forward([1], native.new_session().cache)


@pytest.mark.parametrize(
    "now, pending, want_wait",
    [
        (0.020, 1, True),  # came at 0, during the batch that ended at 0.010: waits to 0.025 for the other turn
        (0.026, 1, False),  # past 0.010 + WAIT_S: runs, half full, rather than wait on
        (0.012, 2, False),  # every running turn has its call in: at once
    ],
)
def test_a_call_that_came_during_a_batch_waits_from_its_end(now, pending, want_wait):
    """The step thread's wait (`BatchedRunner._wait`), on a clock of the test's: a call that came while a
    batch ran waits up to WAIT_S from that batch's end, not from its own coming, for the other running
    turns' calls. Counted from its coming, the turns the batch just answered would miss it: two groups
    would take turns, in half-full batches (what serve_load first measured)."""
    from chatcli.engine.runners import batched as b

    runner = b.BatchedRunner(object(), clock=lambda: now)
    runner._running, runner._free_since = 2, 0.010
    runner._pending = [b._Call([1], None, False, since=0.0, start=0) for _ in range(pending)]
    wait = runner._wait()
    assert (wait is not None and wait > 0) == want_wait


# -- clients that leave: a slot is never held by a client that is gone (issue 46) ---------------------------

HOSTILE = {"messages": [{"role": "user", "content": "a"}] * 20000, "max_tokens": 2}  # 680 KB, under the cap
LEAVE_S = 1.0  # each hostile client's read timeout: it is gone after this long


def cancelled_requests(server) -> int:
    """`chatcli_requests_total{outcome="cancelled"}` from /metrics."""
    text = httpx.get(server.url + "/metrics", timeout=TIMEOUT).text
    line = next(line for line in text.splitlines() if line.startswith('chatcli_requests_total{outcome="cancelled"}'))
    return int(line.rsplit(" ", 1)[1])


def hostile_clients(
    server, n: int, outcomes: tuple[str, ...] = ("cancelled",)
) -> tuple[list[float], list[float], float, httpx.Response]:
    """`n` clients POST HOSTILE at once (every other one streaming), each gone after LEAVE_S; meanwhile a
    well-behaved `hi`. The times the clients left, the times the worker counted a request ended as one of
    `outcomes` (a slot or a queue place freed), the time the `hi` was answered, and its response."""
    left: list[float] = []
    freed: list[float] = []
    worker = server.worker

    def hostile(i: int) -> None:
        with pytest.raises(httpx.ReadTimeout):  # a stream's headers come with its first event: none within LEAVE_S
            server.post({**HOSTILE, "stream": i % 2 == 0}, timeout=httpx.Timeout(TIMEOUT, read=LEAVE_S))
        left.append(time.monotonic())

    def watch() -> None:  # the worker's counter, read every few ms: when each cancelled job ended
        deadline = time.monotonic() + TIMEOUT
        while len(freed) < n and time.monotonic() < deadline:
            ended = sum(getattr(worker, outcome) for outcome in outcomes)
            freed.extend([time.monotonic()] * (ended - len(freed)))
            time.sleep(0.005)

    with ThreadPoolExecutor(n + 1) as pool:
        watcher = pool.submit(watch)
        hostiles = [pool.submit(hostile, i) for i in range(n)]
        deadline = time.monotonic() + TIMEOUT
        while worker.pending < n:  # all of them queued or templating before the `hi` comes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        hi = server.post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        answered = time.monotonic()
        for f in [*hostiles, watcher]:
            f.result(TIMEOUT)
    assert len(freed) == n
    return sorted(left), freed, answered, hi


def test_hostile_clients_that_leave_never_hold_a_slot(native, serve, monkeypatch):
    """Four clients send a conversation of 20,000 messages and leave after a second: each templating of
    theirs is made 0.4 s slower (a heavy template; fitting one takes ~12), two run, two wait in the queue.
    Every hostile slot is free within 1 s of its client leaving (the fitting stops before its next
    templating: `fit_prompt`'s cancel), and a `hi` sent meanwhile is answered soon after they left."""
    encode = native.tokenizer.encode_chat

    def heavy(messages, *args, **kwargs):
        if messages[-1]["content"] == "a":
            time.sleep(0.4)
        return encode(messages, *args, **kwargs)

    monkeypatch.setattr(native.tokenizer, "encode_chat", heavy)
    server = serve(native, parallel=2)
    left, freed, answered, hi = hostile_clients(server, 4)
    assert cancelled_requests(server) == 4  # as /metrics counts them
    assert hi.status_code == 200 and hi.json()["choices"][0]["finish_reason"] in ("stop", "length")
    held = max(f - t for f, t in zip(freed, left, strict=True))
    assert held < 1.0, f"a slot was held {held:.1f} s after its client left"
    assert answered - left[-1] < 1.5, f"the hi was answered {answered - left[-1]:.1f} s after the clients left"
    assert server.worker.wait_idle(5) and server.worker.running == 0


# Nested loops in the template for a conversation of more than one message: each render of a hostile
# one takes seconds (~10^8 steps: ~4 s here), a `hi`'s is instant.
LOOPING = (
    "{% if messages | length > 1 %}{% for i in range(500) %}{% for j in range(500) %}{% for k in range(500) %}"
    "{% endfor %}{% endfor %}{% endfor %}{% endif %}" + CHATML
)


def test_hostile_clients_with_a_looping_template_never_hold_a_slot(tiny_model_dir, tmp_path, serve):
    """The same on the tiny model loaded as a user's (its own jinja render, `FolderTokenizer`) whose chat
    template loops: the render itself must stop when its client leaves (cancelled; or failed, where a
    render's time limit ends it first)."""
    import shutil

    from chatcli.engine.load.build import load_engine
    from chatcli.engine.load.options import LoadOptions

    folder = shutil.copytree(tiny_model_dir, tmp_path / "looping")
    (folder / "chat_template.jinja").write_text(LOOPING)
    engine = load_engine(str(folder), LoadOptions(device="cpu"))
    server = serve(engine, parallel=2)
    left, freed, answered, hi = hostile_clients(server, 4, ("cancelled", "failed"))
    assert hi.status_code == 200
    held = max(f - t for f, t in zip(freed, left, strict=True))
    assert held < 1.0, f"a slot was held {held:.1f} s after its client left"
    assert answered - left[-1] < 1.5, f"the hi was answered {answered - left[-1]:.1f} s after the clients left"


def test_a_call_whose_turn_is_cancelled_drops_out_of_its_batch():
    """A call that waits for its batch while the batch before runs, its turn cancelled meanwhile, never
    runs: CallDropped in its own thread, nothing written to its cache; the next batch runs without it."""
    from types import SimpleNamespace

    from chatcli.engine.runners.batched import BatchedRunner, CallDropped

    ran: list[list[int]] = []
    first_in, go = threading.Event(), threading.Event()

    class Runner:  # a forward that records its ids, the first held until the test lets it go
        def forward(self, ids, cache):
            first_in.set()
            assert go.wait(TIMEOUT)
            ran.append(list(ids))
            cache.ids.extend(ids)
            return ids

    runner, cancel = BatchedRunner(Runner()), threading.Event()
    caches = [SimpleNamespace(ids=[]), SimpleNamespace(ids=[])]  # what the runner reads of a cache
    with ThreadPoolExecutor(2) as pool, runner.slot(), runner.slot():
        first = pool.submit(runner.forward, [1, 2], caches[0])
        assert first_in.wait(TIMEOUT)  # in flight
        second = pool.submit(runner.forward, [3, 4], caches[1], cancel)
        time.sleep(0.05)  # queued behind it
        cancel.set()
        go.set()
        assert first.result(TIMEOUT) == [1, 2]
        with pytest.raises(CallDropped):
            second.result(TIMEOUT)
    runner.close()
    assert ran == [[1, 2]] and caches[1].ids == []


def test_clients_that_leave_during_prefill_free_their_slots_within_a_second(native, serve):
    """Four clients send prompts of ~200 tokens and leave while they are prefilled together, each row
    made slow (8 ms: a row deep in a long prompt of the embedded model on a busy machine costs more). Each
    slot is free within 1 s of its client leaving: a chunk is sized so that a batch takes ~BATCH_S, and a
    call whose turn was cancelled drops out of the next batch (where a batch of four 128-row chunks took
    4 s, then each turn's next chunk ran anyway). The caches stay consistent: the same prompts asked
    again get the replies they get alone."""
    row_s = 0.008
    batched, alone_forward = native.runner.forward_batch, native.runner.forward

    def slow_batch(requests):
        time.sleep(row_s * sum(len(ids) for ids, _cache, _every in requests))
        return batched(requests)

    def slow_forward(ids, cache):
        time.sleep(row_s * len(ids))
        return alone_forward(ids, cache)

    prompts = [f"{i} count: " + " ".join(str(j % 10) for j in range(i, i + 120)) for i in range(4)]
    assert min(len(native.tokenizer.encode_chat([{"role": "user", "content": p}])) for p in prompts) > 160
    expected = [alone(native, [{"role": "user", "content": p}], temperature=0, max_tokens=4) for p in prompts]
    native.runner.forward_batch, native.runner.forward = slow_batch, slow_forward
    server = serve(native, parallel=4)
    worker, left, freed = server.worker, [], []

    def leaver(prompt: str) -> None:
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 4}
        with pytest.raises(httpx.ReadTimeout):
            server.post(body, timeout=httpx.Timeout(TIMEOUT, read=1.5))
        left.append(time.monotonic())

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(leaver, p) for p in prompts]:
            f.result(TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while len(freed) < 4 and time.monotonic() < deadline:
            freed.extend([time.monotonic()] * (worker.cancelled - len(freed)))
            time.sleep(0.005)
    assert worker.cancelled == 4 and worker.served == 0, "a client left after its prefill, not during it"
    held = max(f - t for f, t in zip(sorted(freed), sorted(left), strict=True))
    assert held < 1.0, f"a slot was held {held:.1f} s after its client left"
    native.runner.forward_batch, native.runner.forward = batched, alone_forward
    with ThreadPoolExecutor(4) as pool:
        bodies = [{"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 4} for p in prompts]
        replies = list(pool.map(lambda b: server.post(b).json()["choices"][0]["message"]["content"], bodies))
    assert replies == expected
