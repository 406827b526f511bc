"""The chat template a target serves with, and the chat settings a drafter was trained on.

A drafter learns the target's distribution on the prompts it was trained with: a Qwen3.x
drafter trained with the template's thinking switch off (``enable_thinking: false``) drafts
badly under the template's default, thinking on (the z-lab README's Qwen3 example passes
``enable_thinking=False`` for this reason). Losslessness does not depend on it; acceptance does.

Where a drafter directory says what it was trained with, ``training.json`` holds
``chat_template_kwargs`` (top level, or under ``settings``). :func:`mismatch` compares that with
the deployment's ``serving.enable_thinking`` and the template's switch, for one warning line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def trained_chat(drafter_dir: str | Path) -> dict | None:
    """The ``chat_template_kwargs`` a drafter was trained with, or None when it does not say."""
    f = Path(drafter_dir) / "training.json"
    try:
        data = json.loads(f.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    kwargs = data.get("chat_template_kwargs") or (data.get("settings") or {}).get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else None


def chat_template(target_dir: str | Path) -> str | None:
    """The target's chat template text (``chat_template.jinja`` or ``tokenizer_config.json``), if any."""
    path = Path(target_dir)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        tpl = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    return tpl if isinstance(tpl, str) else None


def serving_chat(target_dir: str | Path, enable_thinking: bool | None) -> dict:
    """What the bundle records: the template's sha256, whether it has a thinking switch, and
    the switch the deployment serves with (None: the template's default)."""
    tpl = chat_template(target_dir)
    return {
        "chat_template_sha256": hashlib.sha256(tpl.encode()).hexdigest() if tpl else None,
        "thinking_switch": ("enable_thinking" in tpl) if tpl else None,
        "enable_thinking": enable_thinking,
    }


def chat_mismatch(trained: dict | None, serving: dict) -> str | None:
    """One warning line when the serving thinking setting differs from the drafter's, else None."""
    if not trained or "enable_thinking" not in trained:
        return None
    want, have = bool(trained["enable_thinking"]), serving.get("enable_thinking")
    if have is None and serving.get("thinking_switch") is False:
        return None  # the template has no switch: nothing to differ
    if have is None:
        return (
            f"the drafter was trained with enable_thinking={str(want).lower()}; this deployment serves the "
            f"chat template's default: set serving.enable_thinking: {str(want).lower()} (acceptance suffers)"
        )
    if have != want:
        return (
            f"the drafter was trained with enable_thinking={str(want).lower()} but the deployment serves "
            f"enable_thinking={str(have).lower()}: acceptance suffers (the output stays the target's)"
        )
    return None
