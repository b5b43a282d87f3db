"""precision_plugin refuses a scaler that is not a GradScaler and an
unknown device at the call (before: accepted, and failing inside ``fit``)."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from mixprec.integrations.lightning import precision_plugin  # noqa: E402


def test_a_scaler_that_is_not_a_grad_scaler_is_refused() -> None:
    with pytest.raises(TypeError, match="scaler must be a torch.amp.GradScaler .* got str"):
        precision_plugin("16-mixed", "cpu", scaler="yes")  # type: ignore[arg-type]


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="device must be a device type .* got 'tpu'"):
        precision_plugin("16-mixed", "tpu")
