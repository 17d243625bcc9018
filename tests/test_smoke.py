import bertheads


def test_tiny_classify_roundtrip(tiny_bert, write, tmp_path):
    rows = "sentence\tlabel\n" + "".join(f"good fun {i}\t1\nawful bore {i}\t0\n" for i in range(20))
    train = write("train.tsv", rows)
    model = bertheads.train("classify", train, train, tmp_path / "m", model=tiny_bert,
                            settings=bertheads.TrainSettings(epochs=1, batch_size=8, progress=False))
    out = model.predict(["good fun", ("a", "b")])
    assert {o["label"] for o in out} <= {0, 1}
