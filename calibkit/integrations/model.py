"""``CalibratedModel``: a classifier and its fitted calibrator served as one ``nn.Module``.

``CalibratedModel(model, calibrator)(x)`` returns the calibrated probabilities
``calibrator.predict_proba(model(x))``: ``(N, K)`` rows (``(N,)`` positive-class probabilities for
a binary model with one logit per sample). :meth:`CalibratedModel.logits` returns calibrated
logits: ``calibrator.transform(model(x))`` where the calibrator is a logit map
(:class:`~calibkit.calibrators.TemperatureScaling`), otherwise ``log p`` of the calibrated
probabilities (``logit p`` for binary ones), the logits whose softmax (sigmoid) gives them back,
so a loss or a metric that takes logits sees the calibrated model.

The model's output must be its logits: a tensor, or a tuple or list whose first item is the logits
(models that also return features). The calibrator is fitted beforehand, on validation logits of
the same model in evaluation mode; put the wrapper in evaluation mode too (``.eval()``) before
predicting, as for any module with dropout or batch norm.

Saving, two ways, both giving identical outputs after loading:

* ``state_dict()`` holds the model's weights (under ``model.``) and the calibrator (its registry
  name, hyperparameters and fitted state, under ``_extra_state``), so ``torch.save(cm.state_dict())``
  and ``load_state_dict`` carry both; loading validates the calibrator's state with the checks of
  :func:`calibkit.calibrators.load`, and the wrapper being loaded may hold any calibrator (it is
  replaced by the saved one).
* :meth:`CalibratedModel.save` writes a directory: ``model.safetensors`` (the weights) and the
  calibrator's ``calibrator.safetensors`` + ``calibrator.json`` (:func:`calibkit.calibrators.save`);
  :meth:`CalibratedModel.load` reads it back into a model of the same architecture.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from calibkit.calibrators._state import StateError
from calibkit.calibrators.io import _registry_name, calibrator_class, check_fitted_state
from calibkit.calibrators.io import load as load_calibrator
from calibkit.calibrators.io import save as save_calibrator
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.errors import UserError

__all__ = ["CalibratedModel"]

MODEL_FILE = "model.safetensors"
CALIBRATOR_STEM = "calibrator"


class CalibratedModel(nn.Module):
    """A model and its post-hoc calibrator as one module (module docstring).

    Args:
        model: the classifier, an ``nn.Module`` whose output is its logits (module docstring).
        calibrator: a calibrator of :data:`calibkit.calibrators.CALIBRATORS` (fitted before predicting;
            an unfitted one can be passed to receive a saved state through ``load_state_dict``).
    """

    def __init__(self, model: nn.Module, calibrator):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise UserError(f"CalibratedModel takes an nn.Module as model, got {type(model).__name__}")
        _registry_name(calibrator)  # a registered calibrator: it can be saved and loaded
        self.model = model
        self.calibrator = calibrator

    def _logits(self, x) -> torch.Tensor:
        out = self.model(x)
        if isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise UserError(f"the model returned {type(out).__name__}; CalibratedModel needs its logits: a tensor, "
                            "or a tuple whose first item is the logits")
        return out

    def forward(self, x) -> torch.Tensor:
        """Calibrated probabilities of the inputs ``x`` (whatever the model takes)."""
        return self.calibrator.predict_proba(self._logits(x))

    def logits(self, x) -> torch.Tensor:
        """Calibrated logits of ``x``: the calibrator's ``transform`` where it has one, else
        ``log p`` (binary: ``log(p / (1 - p))``) of the calibrated probabilities."""
        z = self._logits(x)
        if hasattr(self.calibrator, "transform"):
            return self.calibrator.transform(z)
        p = self.calibrator.predict_proba(z)
        return torch.logit(p) if p.dim() == 1 else torch.log(p)

    # -- saving --------------------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        """The calibrator as ``state_dict`` holds it: registry name, hyperparameters, fitted state
        (``None`` while unfitted)."""
        cal = self.calibrator
        name = _registry_name(cal)
        if not _is_fitted(cal):
            return {"calibrator": name, "params": cal.get_params(deep=False), "state": None}
        return {"calibrator": name, **cal.to_dict()}

    def set_extra_state(self, state: dict) -> None:
        """Rebuild the calibrator from :meth:`get_extra_state`'s dict, validated as
        :func:`calibkit.calibrators.load` validates a file."""
        if not isinstance(state, dict) or calibrator_class(state.get("calibrator")) is None:
            got = state.get("calibrator") if isinstance(state, dict) else type(state).__name__
            raise UserError(f"the saved calibrator {got!r} is not one of {', '.join(CALIBRATORS)}, stack")
        name = state["calibrator"]
        try:
            cal = calibrator_class(name).from_dict({"params": state.get("params", {}), "state": state.get("state")})
            cal._check_params()
            if state.get("state"):
                check_fitted_state(name, cal)
        except StateError as exc:
            raise UserError(f"the saved {name} calibrator: {exc}") from None
        self.calibrator = cal

    def save(self, directory) -> Path:
        """Write ``directory/model.safetensors`` and ``directory/calibrator.{safetensors,json}``;
        returns the directory. The calibrator must be fitted."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_calibrator(self.calibrator, out / CALIBRATOR_STEM)  # refuses an unfitted calibrator first
        save_model(self.model, str(out / MODEL_FILE))
        return out

    @classmethod
    def load(cls, directory, model: nn.Module, device=None) -> CalibratedModel:
        """The :class:`CalibratedModel` saved by :meth:`save` in ``directory``, its weights loaded
        into ``model`` (the same architecture, built by the caller) on ``device`` (default: CPU)."""
        src = Path(directory)
        if not (src / MODEL_FILE).is_file():
            raise UserError(f"{src / MODEL_FILE} not found: pass the directory written by CalibratedModel.save")
        cal = load_calibrator(src / CALIBRATOR_STEM)
        load_model(model, str(src / MODEL_FILE), device=str(device or "cpu"))
        return cls(model, cal)


def _is_fitted(cal) -> bool:
    try:
        cal._check_fitted()
    except ValueError:
        return False
    return True
