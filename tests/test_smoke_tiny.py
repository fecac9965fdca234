from chatcli.engine.engine import Finished
from chatcli.engine.sample.sampling import SamplingParams


def test_tiny_engine_generates(tiny_engine):
    session = tiny_engine.new_session()
    events = list(
        tiny_engine.generate(
            [{"role": "user", "content": "Hello"}], session, SamplingParams(temperature=0, max_tokens=8)
        )
    )
    done = events[-1]
    assert isinstance(done, Finished)
    assert done.stats.prompt_tokens > 0 and done.stats.completion_tokens >= 1
