

@pytest.mark.parametrize("family", ["chronos2", "tirex"])
def test_every_family_exports_with_random_weights(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny configs of the other two families export and pass their parity (Chronos-2's tiny config once
    had quantiles that upstream's ``predict`` refused to unroll: an internal error)."""
    pytest.importorskip("tirex")
    output = tmp_path / f"{family}.onnx"
    argv = ["export", family, "--random-weights", "--output", str(output), "--resolution-minutes", "60"]
    assert cli.main([*argv, "--parity-windows", "2"]) == 0, capsys.readouterr().err[-2000:]
    metadata = json.loads(output.with_suffix(".metadata.json").read_text())
    assert metadata["model_family"] == family and metadata["description"].startswith(MEANINGLESS)
    assert json.loads(output.with_suffix(".parity.json").read_text())["passed"] is True
