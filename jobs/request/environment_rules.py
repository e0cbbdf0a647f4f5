"""Which environment variables a request may give its training container, and which values it may give them.

A request's `environment` lands in CreateTrainingJob's Environment: every process of the container inherits
it, the toolkit's `/bin/sh` and every Python interpreter included, and it is readable by anyone who may
describe the execution or the job. So:

- Names come from an allow-list of patterns (ALLOWED_PATTERNS: the tuning knobs of NCCL, libfabric, PyTorch,
  CUDA, Hugging Face, W&B and the thread pools), plus the patterns the platform settings add
  (`environment_patterns`). An allow-list, because the variables that change what a process *runs* are many
  and open-ended; the knobs a training run needs are few and known.
- Some names are refused even when a pattern would allow them (REFUSED): the loader's, interpreters', the
  shell's, SageMaker's, AWS's and the platform's own, and, by what they do whatever their prefix, every variable
  that makes a process load code (LOADS_CODE: a library or plugin, a folder of compiled or downloaded modules,
  a file of further variables, a server that serves code or takes the run's data). A prefix says whose knob a
  variable is, not what it does: `NCCL_NET_PLUGIN=/opt/ml/input/data/train/x.so` would run the request's own
  library as the team's role in every rank, so such names are refused by name, and a value that names a shared
  library is refused under any name. `PYTHONWARNINGS` with `BROWSER`, `LD_PRELOAD`,
  `BASH_ENV` or `PYTHONPATH` run code of the request's choosing in every process; `TRAINING_STOP_FILE` or
  `TRAINING_CHECKPOINT_DIR` would silently disable the stop relay or move checkpoints off the synced folder.
  Names compare case-insensitively here (Linux does not, but `Path` or `ld_preload` has no business in a
  training job either).
- Values that look like credentials are refused (CREDENTIAL_NAMES with any value; AWS access key ids, private
  keys, well-known token prefixes and long random-looking tokens under any name): the request is the
  execution's input, so a value there is readable in DescribeExecution, GetExecutionHistory and
  DescribeTrainingJob, and logged. The fix is the request's `secrets` field: Secrets Manager ARNs that the
  container resolves at start (jobs.render.container_entry), never the values. A platform's (a team's) jobs name only
  secrets under `<name_prefix>/` in its own account and region (secrets_scope): the ARN pattern its execution role
  is to be allowed to read, so that Prepare refuses another team's secret rather than the job failing on it.
- Values are plain text: jobs.request.command_line's characters plus `^` (NCCL_SOCKET_IFNAME's "all but" prefix). They
  do not reach the toolkit's command line, but nothing in a variable needs a quote, a `$` or a space.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections import Counter

from contract.container import ENV_CHECKPOINT_DIR, ENV_RUN_ID, ENV_SECRET_ARNS, ENV_STOP_FILE
from jobs.platform import PlatformSettings
from jobs.request.command_line import SAFE_PUNCTUATION, unsafe_characters
from jobs.request.limits import MAX_ENVIRONMENT_TEXT, PLATFORM_ENVIRONMENT, RUN_ENVIRONMENT

# What a request may set on any platform (fnmatch patterns, upper case).
ALLOWED_PATTERNS = (
    "NCCL_*", "FI_*", "TORCH_*", "TORCHINDUCTOR_*", "PYTORCH_*", "CUDA_*", "CUBLAS_WORKSPACE_CONFIG",
    "HF_*", "TRANSFORMERS_*", "TOKENIZERS_PARALLELISM", "WANDB_*", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)
# Never a request's, whatever a pattern allows: (pattern, whose it is and what it would do).
_LOADER = "the dynamic loader's: it loads code of the request's choosing into every process"
_INTERPRETER = "an interpreter's: it runs or imports code of the request's choosing in every process"
_SHELL = "the shell's: it changes what the container's shells run"
_PLATFORM = "the platform's: the launcher sets it, and the container entry and the training package rely on it"
# Variables that make a process load code, by meaning (reviewed against the NCCL, libfabric, CUDA, PyTorch and
# Inductor, Hugging Face and W&B documentation, 2026-11): (pattern, what it would load). Patterns by meaning
# (`*_PLUGIN`, `*_ENDPOINT`...) cover future knobs of the same kind under any prefix.
_LIBRARY = "a library or plugin the process loads: its code would run as the team's role in every rank"
_PROGRAM = "a program a library starts: it would run as the team's role"
_CODE_FOLDER = ("a folder of compiled or downloaded code (or pickled weights) the process loads from: files placed "
                "there would run as the team's role")
_CONFIG_FILE = "a file of further NCCL variables, the plugins' among them"
_REMOTE = "a server of the request's choosing, which would serve the process code or receive the run's data"
_REMOTE_CODE = "a switch that lets a library download and run a model's or a dataset's own code"
LOADS_CODE: tuple[tuple[str, str], ...] = (
    # NCCL: the net, tuner, profiler and env plugins (libnccl-*.so by name or path); NCCL_CONF_FILE (2.23+) sets any
    # of them from a file.
    ("*_PLUGIN", _LIBRARY), ("*_PLUGIN_PATH", _LIBRARY), ("NCCL_CONF_FILE", _CONFIG_FILE),
    # libfabric loads providers (EFA's among them) from FI_PROVIDER_PATH; CUDA loads an injection library at init.
    ("*_PROVIDER_PATH", _LIBRARY), ("CUDA_INJECTION*_PATH", _LIBRARY), ("*_EXECUTABLE", _PROGRAM),
    # PyTorch's C++ extensions, Inductor's and CUDA's kernel caches, torch.hub's folder, Hugging Face's caches
    # (dynamic modules, and weights that load by unpickling).
    ("*_EXTENSIONS_DIR", _CODE_FOLDER), ("TORCHINDUCTOR_CACHE_DIR", _CODE_FOLDER),
    ("TORCHINDUCTOR_CUTLASS_DIR", _CODE_FOLDER), ("CUDA_CACHE_PATH", _CODE_FOLDER),
    ("PYTORCH_KERNEL_CACHE_PATH", _CODE_FOLDER), ("TORCH_HOME", _CODE_FOLDER), ("HF_HOME", _CODE_FOLDER),
    ("HF_*_CACHE", _CODE_FOLDER), ("TRANSFORMERS_CACHE", _CODE_FOLDER), ("HUGGINGFACE_HUB_CACHE", _CODE_FOLDER),
    # Servers: Inductor's remote caches (compiled code), Hugging Face's endpoint, W&B's server.
    ("TORCHINDUCTOR_*REMOTE*", _REMOTE), ("TORCHINDUCTOR_REDIS_*", _REMOTE), ("*_ENDPOINT", _REMOTE),
    ("*_BASE_URL", _REMOTE), ("*TRUST_REMOTE_CODE*", _REMOTE_CODE),
)
REFUSED: tuple[tuple[str, str], ...] = (
    *LOADS_CODE,
    ("LD_*", _LOADER), ("GCONV_PATH", _LOADER), ("MALLOC_*", _LOADER),
    ("PYTHON*", _INTERPRETER), ("BROWSER", _INTERPRETER), ("PERL5*", _INTERPRETER), ("PERLLIB", _INTERPRETER),
    ("NODE_OPTIONS", _INTERPRETER), ("RUBYOPT", _INTERPRETER), ("JAVA_TOOL_OPTIONS", _INTERPRETER),
    ("BASH_ENV", _SHELL), ("BASH_FUNC_*", _SHELL), ("ENV", _SHELL), ("PATH", _SHELL), ("HOME", _SHELL),
    ("SHELL", _SHELL), ("SHELLOPTS", _SHELL), ("IFS", _SHELL), ("PS4", _SHELL), ("PROMPT_COMMAND", _SHELL),
    ("CDPATH", _SHELL),
    ("SAGEMAKER_*", "SageMaker's: the toolkit reads it to pick the program, the module and the launcher"),
    ("SM_*", "SageMaker's: the toolkit sets it (paths, hosts, hyperparameters)"),
    ("AWS_*", "AWS's: SDKs read credentials, endpoints and the region from it"),
    *((name, _PLATFORM) for name in (ENV_CHECKPOINT_DIR, ENV_STOP_FILE, ENV_RUN_ID, ENV_SECRET_ARNS,
                                     *PLATFORM_ENVIRONMENT, *RUN_ENVIRONMENT)),
)
# Names whose value is a credential whatever it looks like: give them through `secrets`.
CREDENTIAL_NAMES = ("*SECRET*", "*_TOKEN", "TOKEN", "*PASSWORD*", "*PASSWD*", "*API_KEY*", "*APIKEY*",
                    "*ACCESS_KEY*", "*PRIVATE_KEY*", "*CREDENTIAL*")
# Values that are credentials under any name: AWS access key ids, PEM private keys, well-known token prefixes.
_CREDENTIAL_VALUE = re.compile(
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}|-----BEGIN [A-Z ]*PRIVATE KEY"
    r"|(?<![A-Za-z0-9])(?:ghp|gho|ghs|github_pat|hf|xox[bp]|sk|glpat)[_-][A-Za-z0-9_-]{16,}")
# Long random-looking tokens, whatever their name: 40+ hex digits (W&B keys; a git commit id is caught too), or
# 32+ base64 characters mixing upper case, lower case and digits with a long run between slashes (AWS secret
# keys, most API keys). Paths and readable names are cut short by `-`, `_`, `.` or their `/`s, and rarely mix
# all three classes; the entropy bound leaves out repetitive strings.
_HEX_TOKEN = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{40,}(?![0-9A-Za-z])")
_BASE64_TOKEN = re.compile(r"[A-Za-z0-9+/=]{32,}")
_TOKEN_SEGMENT = 16  # characters between slashes, at least, in one place
_TOKEN_ENTROPY_BITS = 3.5  # per character; base64 keys have about 4.5-5
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A value that names a shared library (`libx.so`, `/a/libx.so.1`): only code loaders read one.
_SHARED_LIBRARY = re.compile(r"\.so(?:\.[0-9]+)*(?:$|[,:;])")
# A Secrets Manager secret's ARN: its name is letters, digits and /_+=.@- (plus the service's 6-character suffix).
SECRET_ARN = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}")
_VALUE_PUNCTUATION = SAFE_PUNCTUATION + "^"
ENV_VALUE = re.compile(r"[A-Za-z0-9" + re.escape(_VALUE_PUNCTUATION) + r"]*")
SECRETS_HINT = ("put the value in AWS Secrets Manager under the platform's name prefix and give its ARN in the "
                "request's `secrets` ({\"NAME\": \"arn:aws:secretsmanager:<region>:<account>:secret:<name_prefix>/"
                "<name>\"}): the container reads it at start, and the value never enters the execution's input or "
                "history")


def _matches(name: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), p.upper()) for p in patterns)


def refused_reason(name: str) -> str | None:
    """Whose variable `name` is, when no request may set it."""
    return next((reason for pattern, reason in REFUSED if fnmatch.fnmatchcase(name.upper(), pattern)), None)


def name_problem(name: str) -> str | None:
    """Why no request may set `name` on any platform (syntax, the refused names); None when some may."""
    if not ENV_NAME.fullmatch(name) or len(name) > MAX_ENVIRONMENT_TEXT:
        return f"names must match [a-zA-Z_][a-zA-Z0-9_]* (at most {MAX_ENVIRONMENT_TEXT} characters)"
    if name in PLATFORM_ENVIRONMENT:
        return f"is set by the platform ({name}={PLATFORM_ENVIRONMENT[name]}); remove it"
    if name in RUN_ENVIRONMENT:
        return f"is set by the platform to {RUN_ENVIRONMENT[name]}; remove it"
    if reason := refused_reason(name):
        return f"is {reason}; a request may not set it: remove it"
    return None


def allowed_problem(name: str, extra_patterns: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why this platform does not let a request set `name` (the allow-list); None when it does."""
    patterns = (*ALLOWED_PATTERNS, *extra_patterns)
    if _matches(name, patterns):
        return None
    return (f"is not a variable a training request may set here (allowed: {', '.join(patterns)}); rename it, or "
            "ask the platform team to add a pattern (platform config `environment_patterns`)")


def credential_problem(name: str, value: str) -> str | None:
    """Why `value` looks like a credential (never echoing it), with the fix; None when it does not."""
    if value and _matches(name, CREDENTIAL_NAMES):
        return f"holds a credential by its name (a {len(value)}-character value); {SECRETS_HINT}"
    if _CREDENTIAL_VALUE.search(value) or _random_token(value):
        return f"has a value that looks like a credential (an access key, a private key or a token); {SECRETS_HINT}"
    return None


def _random_token(value: str) -> bool:
    if any(re.search(r"\d", t) and re.search(r"[a-fA-F]", t) for t in _HEX_TOKEN.findall(value)):
        return True
    return any(max(len(part) for part in token.split("/")) >= _TOKEN_SEGMENT
               and all(re.search(c, token) for c in ("[a-z]", "[A-Z]", "[0-9]"))
               and _entropy(token) >= _TOKEN_ENTROPY_BITS for token in _BASE64_TOKEN.findall(value))


def _entropy(token: str) -> float:
    """Shannon entropy, bits per character."""
    return -sum(n / len(token) * math.log2(n / len(token)) for n in Counter(token).values())


def value_problem(value: str) -> str | None:
    if len(value) > MAX_ENVIRONMENT_TEXT:
        return f"values are at most {MAX_ENVIRONMENT_TEXT} characters, this one has {len(value)}"
    if _SHARED_LIBRARY.search(value):
        return (f"{value[:80]!r} names a shared library: a variable that takes one loads its code into every rank "
                "as the team's role, and no training knob needs one; remove it")
    if not ENV_VALUE.fullmatch(value):
        return (f"{value[:80]!r} has characters the platform does not pass in a variable: "
                f"{unsafe_characters(value.replace('^', ''))}; use only letters, digits and "
                f"{' '.join(_VALUE_PUNCTUATION)}")
    return None


def check_secrets(secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(name, problem) for every entry of a request's `secrets` that is not `NAME: <Secrets Manager ARN>`. Names
    obey the variables' rules (they become variables); values are ARNs, never the secrets themselves."""
    found = []
    for name, arn in secrets.items():
        if not isinstance(arn, str):  # the schema engine reports the type
            continue
        if message := name_problem(name):
            found.append((name, message))
        elif not SECRET_ARN.fullmatch(arn):
            # Not echoed: someone may have put the secret itself here.
            found.append((name, f"is not a Secrets Manager secret ARN (a {len(arn)}-character value): give "
                                "arn:aws:secretsmanager:<region>:<account>:secret:<name_prefix>/<name> (the secret's "
                                "value stays in Secrets Manager; the container reads it at start)"))
    return found


def secrets_scope(region: str, account: str, name_prefix: str) -> str:
    """The secrets a platform's (or a team's) jobs may name: `<name_prefix>/...` in its own account and region, the
    ARN pattern its execution role may read (secretsmanager:GetSecretValue)."""
    return f"arn:aws:secretsmanager:{region}:{account}:secret:{name_prefix}/*"


def secret_scope_problem(arn: str, platform: PlatformSettings) -> str | None:
    """Why this platform's jobs cannot read the secret `arn` (another account, region or team); None when they can."""
    if not SECRET_ARN.fullmatch(arn):  # the field rule reports it
        return None
    account = platform.execution_role_arn.split(":")[4]
    scope = secrets_scope(platform.region, account, platform.name_prefix)
    _, _, _, region, arn_account, _, name = arn.split(":", 6)
    if (region, arn_account) == (platform.region, account) and name.startswith(f"{platform.name_prefix}/"):
        return None
    return (f"{arn!r} is not one of this platform's secrets: its jobs read {scope} (their execution role's "
            f"permission); create the secret under {platform.name_prefix}/ in account {account}, {platform.region}")


def secrets_problems(environment: dict[str, str], secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(field path, problem) across `environment` and `secrets`: one name in both, or more ARNs than one
    variable holds."""
    found = [(f"secrets.{name}", f"is also in environment; give {name} in one of them") for name in secrets
             if name in environment]
    size = len(secrets_variable(secrets))
    if size > MAX_ENVIRONMENT_TEXT:
        found.append(("secrets", f"the ARNs take {size} characters as JSON, over the {MAX_ENVIRONMENT_TEXT} of the "
                                 "one variable that carries them; use fewer secrets (one secret can hold a JSON "
                                 "object of several values)"))
    return found


def secrets_variable(secrets: dict[str, str]) -> str:
    """The value of contract.container.ENV_SECRET_ARNS for these secrets (compact JSON)."""
    return json.dumps(secrets, separators=(",", ":"), sort_keys=True)


def check_environment(env: dict[str, str]) -> list[tuple[str, str]]:
    """(name, problem) for every variable no platform lets a request set as given (the request's field rule;
    the allow-list, which depends on the platform, is environment_problems)."""
    found = []
    for name, value in env.items():
        if not isinstance(value, str):  # the schema engine reports the type
            continue
        if message := name_problem(name) or credential_problem(name, value) or value_problem(value):
            found.append((name, message))
    return found


def environment_problems(env: dict[str, str], extra_patterns: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, problem) for every variable this platform's allow-list leaves out."""
    return [(name, message) for name in env if (message := allowed_problem(name, extra_patterns))]
