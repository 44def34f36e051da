"""The reference side of bench/reference_check.py: trains a value model with the PITA reference
code (flash-36/PITA's ``ValueClassifier`` and its ``PITATrainer`` / ``QSharpTrainer``) on examples
pita built, and saves its weights. Run by the bench as a script, with the reference checkout
first on ``sys.path`` so that ``import pita`` is the reference's package, never this project's:

    python bench/reference_side.py SPEC.json

SPEC: {"checkout", "method" (PITA | QSharp), "backbone", "loss" (bce | mle), "num_atoms", "v_min",
"v_max", "lr", "weight_decay", "epochs", "batch_size", "seed", "items", "out"}; ``items`` as its
trainers read them (PITA: input_ids, chosen_target_ids, rejected_target_ids; Q#: input_ids,
target_ids, rewards, loss_weights). Writes ``out`` (the state dict: ``backbone.*`` and
``score.*``, the names pita's reference head has) and ``out.json`` (what its trainer returned).
It imports nothing of this project.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    checkout = str(Path(spec["checkout"]).resolve())
    sys.path.insert(0, checkout)
    for name in [m for m in sys.modules if m == "pita" or m.startswith("pita.")]:
        del sys.modules[name]
    import torch

    import pita  # the reference's package

    where = [str(Path(p).resolve()) for p in getattr(pita, "__path__", [])]
    if str(Path(checkout, "pita")) not in where:
        raise SystemExit(f"reference_side: `import pita` found {where}, not {checkout}/pita; run it with the "
                         f"checkout first on sys.path and this project's folder off it")
    from transformers import AutoTokenizer

    from pita.models.value_classifier import ValueClassifier
    from pita.trainers.pita_trainer import PITATrainer
    from pita.trainers.qsharp_trainer import QSharpTrainer

    torch.manual_seed(int(spec["seed"]))
    tok = AutoTokenizer.from_pretrained(spec["backbone"])
    clf = ValueClassifier(spec["backbone"], tok, device="cpu", loss_type=spec["loss"], num_atoms=int(spec["num_atoms"]),
                          V_min=float(spec["v_min"]), V_max=float(spec["v_max"]), attn_impl="sdpa", dtype="float32",
                          gradient_checkpointing=False)
    trainer_cls = PITATrainer if spec["method"] == "PITA" else QSharpTrainer
    trainer = trainer_cls(clf, tok, batch_size=int(spec["batch_size"]), num_workers=0, lr=float(spec["lr"]),
                          weight_decay=float(spec["weight_decay"]), grad_clip=1.0,
                          pad_token_id=int(tok.pad_token_id if tok.pad_token_id is not None else 0), micro_batch_size=0,
                          amp_dtype="float32", clear_cache_interval=0, max_batch_num_tokens=-1, max_length=-1)
    loader = trainer.create_loader(spec["items"])
    out = trainer.train(loader, num_epochs=int(spec["epochs"]))
    torch.save({k: v.detach().cpu() for k, v in clf.state_dict().items()}, spec["out"])
    Path(spec["out"] + ".json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
