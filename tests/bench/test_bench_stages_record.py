"""`jobs/bench.py stages` records which implementation ran each computation (engine/backend.py) in its JSON line."""

import json

from lilicorr.bench import stages

TINY = ["target.source=random", "target.num_layers=2", "target.hidden_size=64", "target.num_heads=4",
        "target.num_kv_heads=2", "target.head_dim=16", "target.intermediate_size=128"]


def test_stages_json_line_names_each_rows_backend(capsys):
    stages.main(["--systems", "ar", "--variants", ";engine.backend=reference", "--prompts", "1",
                 "--max-new-tokens", "4", "--threads", "1", *TINY])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    auto, ref = line["rows"]
    assert auto["backend"]["backend"] == "auto" and auto["backend"]["target_steps"] == "scripted-stack"
    assert ref["overrides"] == "engine.backend=reference"
    assert (ref["backend"]["target_steps"], ref["backend"]["linear"]) == ("eager-layers", "torch")
    assert ref["equal_to_first"] == 1  # the references decode the same greedy tokens


def test_stages_decodes_groups_of_prompts_together_with_batch(capsys):
    """--batch N: groups of N prompts decoded together (a 5th prompt that fills no group is left out), each
    decoder's outputs compared prompt by prompt."""
    stages.main(["--systems", "ar", "--variants", ";engine.backend=reference", "--prompts", "5", "--batch", "2",
                 "--max-new-tokens", "4", "--threads", "1", *TINY])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["batch"], line["prompts"]) == (2, 4)
    assert [r["equal_to_first"] for r in line["rows"]] == [4, 4]
    assert all(len(r["speedup_ci95"]) == 2 for r in line["rows"])
