"""Write asearch's built-in questions as a Search-R1 merged test parquet (FlashRAG columns + verl's, one
`data_source` per set), the peer format `asearch data check` and `asearch eval` read.

    .venv/bin/python bench/searchr1_parquet.py /tmp/cov/searchr1_test.parquet     # wiki10k:n=300 + world:n=100
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from asearch.eval.datasets import load_dataset

SETS = (("wiki10k", "wiki10k:n=300"), ("world", "world:n=100"))


def main(out: str) -> None:
    rows = []
    for source, spec in SETS:
        for i, r in enumerate(load_dataset(spec)):
            rows.append({
                "id": f"test_{i}", "question": r.question, "golden_answers": r.golds, "data_source": source,
                "prompt": [{"role": "user", "content": r.question}], "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": r.golds}},
                "extra_info": {"split": "test", "index": i},
            })  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), out)
    print(f"wrote {len(rows)} questions to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
