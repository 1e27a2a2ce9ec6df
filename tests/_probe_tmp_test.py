from test_annotate import read_records_after, make_items
from candor.judges import normalize
def test_probe(tiny_backend, tmp_path):
    first = read_records_after(tiny_backend, tmp_path / "a.jsonl", make_items()[:2])
    for r in first:
        print(repr(r.greedy.text), repr(normalize(r.greedy.text)))
