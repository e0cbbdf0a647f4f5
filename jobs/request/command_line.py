"""What may reach the training toolkit's command line: the characters a shell reads as plain text.

The SageMaker training toolkit (sagemaker-training `mapping.to_cmd_args` and `process.py`) turns every
hyperparameter but its own `sagemaker_*` keys into `--key value`, where `value` is the JSON-decoded value passed
through `str()` (an object becomes `k=v,k=v`), joins the command with spaces and runs it through `/bin/sh`. So
every key and every value of HyperParameters is shell text, and `/opt/ml/checkpoints$(id)` runs `id` as the
job's execution role.

Decision: restrict, rather than keep values off the command line. The toolkit puts *every* hyperparameter on
the command line; keeping one off it means not sending it as a hyperparameter at all (a file or a variable the
training package reads instead), which would change how the training package is configured in SageMaker, under
`trainctl local` and in its tests, for values that are numbers, booleans, choices and paths in practice. A
character set that a shell reads as one plain word costs those values nothing: ASCII letters and digits plus
SAFE_PUNCTUATION. Whitespace, quotes, `$`, backticks, `;|&<>()\\*?[]{}~!#` and anything outside ASCII (which a
shell or a terminal may read otherwise) are refused, naming the field and the characters. An empty string is
refused too: `--key ''` joined with spaces becomes `--key` and the next word would be read as its value.
Lists and objects are refused in a request (the toolkit writes them with `str()`: brackets, quotes and spaces);
the platform's own object (`mp_parameters`) holds only keys and integers that pass the same rule, which the
renderer asserts for every attempt (jobs.render.training_job).

The same character set bounds the request's other free-text fields (model_size, framework_version, dataset
keys, environment values...): they do not all reach a shell today, but one rule is simpler to trust than a map
of which field reaches which process.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Shell-inert punctuation: none of these starts an expansion, a redirection, a quote or a new command.
SAFE_PUNCTUATION = "._:/=+,@%-"
SAFE_TEXT = re.compile(r"[A-Za-z0-9" + re.escape(SAFE_PUNCTUATION) + r"]+")
SAFE_DESCRIPTION = f"ASCII letters, digits and {' '.join(SAFE_PUNCTUATION)}"
# A hyperparameter's key becomes `--key`: names only (`-` as `model-size` spells it).
SAFE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
# The toolkit's own keys: read by the toolkit, never put on the command line.
TOOLKIT_PREFIX = "sagemaker_"


def unsafe_characters(text: str) -> str:
    """The characters of `text` outside the safe set, each once, as a readable list (`' '` for a space)."""
    seen = dict.fromkeys(ch for ch in text if not SAFE_TEXT.fullmatch(ch))
    return ", ".join(repr(ch) for ch in seen)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be one plain shell word, with the fix; None when it can."""
    if text == "":
        return "is empty; an empty value vanishes from the command line (remove the key, or give a value)"
    if not SAFE_TEXT.fullmatch(text):
        return (f"{text[:80]!r} has characters a shell would interpret or that the platform does not pass: "
                f"{unsafe_characters(text)}; use only {SAFE_DESCRIPTION}")
    return None


def value_problem(value: Any) -> str | None:
    """Why a hyperparameter value cannot go on the command line as one word; None when it can."""
    if isinstance(value, int):  # bool too: str() gives True or False
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict | list):
        return (f"is a JSON {'object' if isinstance(value, dict) else 'list'}; the toolkit writes it with str() "
                "(brackets, quotes and spaces on a shell command line): give a number, true/false or a string")
    return f"{type(value).__name__} values are not passed; give a number, true/false or a string"


def command_line_problems(hyperparameters: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for every hyperparameter that would not reach the command line as `--key word`. The
    toolkit's own `sagemaker_*` keys are included: they are not on the command line, but the platform's values
    are held to the same rule. Objects are checked item by item, as the toolkit writes them (`k=v,k=v`); a list
only under a toolkit key (sagemaker_distribution_instance_groups), item by item."""
    found = []
    for key, value in hyperparameters.items():
        if not SAFE_KEY.fullmatch(key):
            found.append((key, f"key has characters outside letters, digits, '_' and '-': {unsafe_characters(key)}"))
            continue
        items = value.items() if isinstance(value, dict) else [(None, value)]
        if isinstance(value, list) and key.startswith(TOOLKIT_PREFIX):  # off the command line: items only
            items = [(str(i), item) for i, item in enumerate(value)]
        for sub, item in items:
            if sub is not None and not SAFE_KEY.fullmatch(str(sub)):
                found.append((key, f"key {sub!r} has characters outside letters, digits, '_' and '-'"))
            elif problem := value_problem(item):
                found.append((key if sub is None else f"{key}.{sub}", problem))
    return found
