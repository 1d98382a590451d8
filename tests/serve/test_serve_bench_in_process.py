"""`jobs/bench.py serve --in-process N`: the same prompts through a decoder in the bench's process and through the
Serve app over HTTP, interleaved; greedy, so both must write the same text, and the ratio comes with its interval."""

import pytest

from lilicorr.bench import serve_load


def test_in_process_and_http_write_the_same_text(one_torch_thread):
    out = serve_load.main(["--preset", "tiny-random", "--drafter", "random", "--systems", "ar", "--clients", "",
                           "--in-process", "3", "--max-tokens", "6", "target.tie_word_embeddings=false"])
    res = out["in_process"]
    assert res["model"] == "tiny-random-ar" and res["prompts"] == 3
    assert res["same_text"] == 3  # greedy decoding through HTTP is the in-process decoder's own output
    assert res["http_tokens_per_s"] > 0 and res["in_process_tokens_per_s"] > 0
    lo, hi = res["ci95"]
    assert lo <= res["http_over_in_process"] <= hi


def test_in_process_needs_the_server_started_here():
    with pytest.raises(SystemExit):
        serve_load.main(["--url", "http://127.0.0.1:9", "--in-process", "2"])
