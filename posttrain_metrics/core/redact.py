"""Flattening a run config and taking the secrets out of it before any sink sees it.

Redaction works by rules, not by a list of examples. Three rules, applied in this order:

1. **A credential-like name, at any depth.** A key that names a credential (``api_key``,
   ``hfToken``, ``PGPASSWORD``, ``db_pwd``, ``pass``, ``Authorization``, ``webhook_url``) has its
   value replaced, and so does everything under it (``passwords: {admin: ...}``,
   ``secrets: {...}``, ``api_keys: [...]``). Words that only look like credentials stay readable:
   ``max_tokens``, ``eos_token``, ``pad_token_id``, ``tokenizer``, ``sort_key``, ``pass_at_k``, and
   so do names that say where a credential is kept or what kind it is (``hf_token_path``,
   ``password_file``, ``api_key_env``, ``auth_type``: :data:`_ABOUT_A_CREDENTIAL`).
2. **A name paired with its value.** Where a structure pairs a name with a value, the name decides:
   a mapping whose ``name``/``key``/``env``/``header``... field holds a credential name has its other
   fields redacted (Kubernetes ``{name: WANDB_API_KEY, value: ...}``); in a list, the item after a
   credential name or flag is redacted (argv ``["--password", X]``, pairs ``("token", X)``); in text,
   ``name=value``, ``name: value``, ``name = value``, ``"name": "value"`` (escaped inside a JSON
   string too), ``--name value``, ``--name=value``, a printed argv ``'--name', 'value'`` and the
   netrc ``password value`` (DSNs, query strings, env assignments, command lines, YAML, INI, TOML or
   JSON text). After ``name:`` or ``name `` a plain word that a sentence goes on after is prose,
   not a value (``Reply with one token: yes or no``: :func:`_prose`).
3. **The value's own shape.** Wherever a string holds a secret in a recognisable form, that part is
   replaced: a provider token (``hf_``, ``sk-``, ``sk_live_``, ``ghp_``, ``github_pat_``,
   ``glpat-``, ``AIza``, ``AKIA``/``ASIA``, ``xox?-``, ``npm_``, ``pypi-``, Databricks ``dapi`` + 32
   hex, a JWT, an Azure AD client secret ``xxx8Q~...``, a Mailchimp key ``<32 hex>-us12`` ...), a Slack webhook URL, a PEM private-key block, the password of
   ``[user]:password@host`` (with or without a scheme, an empty user included: ``redis://:pw@host``;
   scp-style ``user:pass@host:path``), ``Bearer``/``Basic`` credentials, and any run of 20+ token
   characters that reads as random rather than as a name (:func:`_random_looking`).
   A string that is itself JSON is redacted by its structure (rules 1 and 2), then by its text.
   Mapping keys are text too: a token or a URI with a password used as a key is redacted in it.

Kept on purpose: pure hex (commit ids, UUIDs, digests, MLflow run ids cannot be told from a hex
secret), names built of words, numbers and short tags (paths, checkpoint URIs, experiment names with
hyperparameters, model and dataset names), and placeholders after a credential's name
(``the token: ####``, ``special token: <|endoftext|>``, ``use_auth_token: True``,
``${oc.env:HF_TOKEN}``: :func:`_placeholder`).

Bytes are decoded (UTF-8, undecodable bytes escaped) and redacted as text; tuples as lists.

Every rule runs in linear time: each pattern is anchored where its variable part starts and uses
no nested or backtracking quantifier, PEM blocks are found with ``str.find``, and user:password pairs are looked
for token by token; 1 MB of config redacts in a fraction of a second, whatever its shape.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .cycles import Cycles
from .values import Scalar

__all__ = ["REDACTED", "config_tree", "flatten_config", "is_secret_key", "key_text", "param_text", "redact",
           "redact_text", "redact_tree"]

REDACTED = "***REDACTED***"

# -- rule 1: names ------------------------------------------------------------------------------------

# Found anywhere in a key part, case and separators ignored (PGPASSWORD, MYSQL_PWD, x-api-key).
_SUBSTRINGS = ("password", "passwd", "passphrase", "pwd", "secret", "credential", "apikey", "privatekey",
               "accesskey", "secretkey", "authtoken", "accesstoken", "refreshtoken", "sessiontoken",
               "idtoken", "authorization", "cookie", "webhook", "signature", "bearer", "jwt")
_WORDS = frozenset({"auth", "oauth", "sig", "netrc", "pat", "cred", "creds"})
# "token" is a credential unless it is a vocabulary token or a token count.
_NOT_A_CREDENTIAL_TOKEN = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "id", "ids", "level",
                                     "type", "types", "count", "counts", "len", "length", "max", "min",
                                     "num", "per", "special", "budget", "limit", "weight", "start", "end",
                                     "total", "mean", "avg", "rate", "logprob", "logprobs", "loss"})
# "key" is a credential only next to one of these (not a sort key or a dataset column), or alone.
_KEY_QUALIFIERS = frozenset({"api", "secret", "access", "private", "auth", "encryption", "ssh", "signing",
                             "master", "client", "wandb", "hf", "openai", "anthropic", "aws", "gcp", "azure",
                             "github", "gh", "mlflow", "license", "service", "account", "session", "app",
                             "deploy", "gpg", "pgp", "rsa", "stripe", "slack", "google"})
# A last word that makes the name say where a credential is kept or what kind it is, not hold it:
# hf_token_path, password_file, api_key_env, auth_type, secret_name.
_ABOUT_A_CREDENTIAL = frozenset({"path", "paths", "file", "files", "filename", "dir", "directory", "env", "var",
                                 "type", "kind", "mode", "method", "scheme", "provider", "name", "names",
                                 "enabled", "required", "length", "len", "format", "version", "ttl",
                                 "timeout", "expiry"})
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def _words(part: str) -> list[str]:
    return [w.lower() for w in _SPLIT.split(part) if w]


_TRIGGER_WORDS = r"pass|pwd|secret|cred|key|token|auth|sig|cookie|webhook|bearer|jwt|netrc|pat"
_TRIGGER = re.compile(_TRIGGER_WORDS, re.IGNORECASE)
_TRIGGER_LOWER = re.compile(_TRIGGER_WORDS)  # on lower-cased ASCII text: ten times faster


@functools.lru_cache(maxsize=4096)
def _secret_part(part: str) -> bool:
    """Whether one component of a key path names a credential."""
    if _TRIGGER.search(part) is None:  # the common case, decided at once
        return False
    words = _words(part)
    if len(words) > 1 and words[-1] in _ABOUT_A_CREDENTIAL:
        return False
    squashed = re.sub(r"[^a-z0-9]", "", part.lower())
    if any(s in squashed for s in _SUBSTRINGS):
        return True
    if not words:
        return False
    if set(words) & _WORDS:
        return True
    if words[-1] in ("pass", "passphrase"):  # db_pass, user_pass; not pass_at_k
        return True
    if ("token" in words or ("tokens" in words and "access" in words)) and not set(words) & _NOT_A_CREDENTIAL_TOKEN:
        return True
    keyish = {"key", "keys"} & set(words)
    return bool(keyish) and (bool(set(words) & _KEY_QUALIFIERS) or words in (["key"], ["keys"]))


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether a config key path (``a/b/c``: any part of it) names a credential: ``api_key``,
    ``hfToken``, ``db/password``, ``passwords/admin``, ``PGPASSWORD``, ``Authorization``; not
    ``max_tokens``, ``eos_token`` or ``sort_key``."""
    key = str(key).lstrip("-")
    if _TRIGGER.search(key) is None:
        return False
    return any(_secret_part(part) for part in re.split(r"[/.]", key) if part)


# -- rule 3 (and the text half of rule 2): shapes in text ----------------------------------------------

_TOKEN_PREFIXES = (
    r"hf_", r"sk-(?:proj-|ant-|live-|svcacct-)?", r"[sr]k_(?:live|test)_", r"gh[pousr]_", r"github_pat_",
    r"glpat-", r"gl(?:ptt|dt|rt|soat|cbt)-", r"AIza", r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)", r"xox[abprse]-",
    r"npm_", r"pypi-", r"dop_v1_", r"shp(?:at|ss|ca|pa)_", r"SG\.", r"xai-", r"sq0(?:atp|csp)-",
    r"dapi(?=[0-9a-f]{32})", r"dckr_pat_", r"pplx-", r"gsk_", r"r8_", r"lsv2_(?:pt|sk)_",
    r"nvapi-", r"hvs\.", r"ya29\.", r"sntrys_", r"glc_", r"ATATT", r"LTAI", r"GOCSPX-", r"key-(?=[0-9a-f]{32})",
    # tails of hex and numbers that the random rule keeps as ids: Slack app, Postman, Supabase, Twilio
    r"xapp-", r"PMAK-", r"sbp_(?=[0-9a-f]{40})", r"SK(?=[0-9a-f]{32})",
)
_PROVIDER_TOKEN = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(_TOKEN_PREFIXES) + r")[A-Za-z0-9_.=-]{12,}")
# Fixed shapes without a leading prefix: an Azure AD (Entra) client secret (3 characters, a digit,
# "Q~", 31-34 more) and a Mailchimp key (32 hex, "-us" and a data centre number)
_AZURE_AD_SECRET = re.compile(r"(?<![A-Za-z0-9_.~-])[A-Za-z0-9_-]{3}[0-9]Q~[A-Za-z0-9_.~-]{31,34}(?![A-Za-z0-9_.~-])")
_MAILCHIMP_KEY = re.compile(r"(?<![A-Za-z0-9])[0-9a-f]{32}-us[0-9]{1,2}(?![A-Za-z0-9])")
_SNAKE_NAME = re.compile(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+")  # hf_dataset_name: a name, not a token
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
_SLACK_WEBHOOK = re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[^\s\"'<>]+", re.IGNORECASE)
_AUTH_SCHEME = re.compile(r"(?<![A-Za-z0-9_-])(Bearer|Basic|Token|Digest|Negotiate)\s+([^\s\"',;]{8,})",
                          re.IGNORECASE)
_AFTER_AUTHORIZATION = re.compile(r"authorization[\"']?\s*[:=]\s*[\"']?$", re.IGNORECASE)
_TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # what an Authorization header's credential is made of
_PEM_BEGIN = re.compile(r"-----BEGIN ([A-Z0-9 ]{0,40})-----")
# a value: \"v\" inside a JSON string, "v", 'v', or unquoted up to a separator, a quote, \" or \n
_VALUE = re.compile(r"""\\"[^"\\\n]*\\"|\"[^"\n]*"|'[^'\n]*'|(?:[^\s,;&'"\\]|\\(?!["'ntr]))+""")
# A name and its separator; the value after it is read only when the name is a credential's.
_NAME_RUN = re.compile(r"[A-Za-z0-9_.-]*")
_ASSIGN_SEP = re.compile(r"\\?[\"']?\s*(?:=|:(?!//))\s*")  # name=value, name: value, "name": "value", \"name\": ...
_LIST_SEP = re.compile(r"""(\\?["'])\s*,\s*(?=\1)""")  # a printed argv: '--token', 'value'
_PROSE_WORD = re.compile(r"[A-Za-z][a-z]*[:.,!?]?")
_SPACED_ASSIGN = re.compile(r"[ \t]+=(?!=)")  # INI, TOML, .aws/credentials: name = value
_NEXT_WORD = re.compile(r"[ \t]+[A-Za-z][A-Za-z'-]*")
_SPACE_SEP = re.compile(r"[ \t]+")  # --name value; netrc's "password value"
_NETRC_WORDS = frozenset({"password", "passwd", "passphrase", "secret"})
_NETRC_KEYWORDS = frozenset({"machine", "default", "login", "password", "account", "macdef"})  # pairs follow
_RUN = re.compile(r"[A-Za-z0-9+/_=-]{20,}")
_NONSPACE = re.compile(r"\S+")


def _provider_token(match: re.Match[str]) -> str:
    """A provider token replaced; after a separator (``run-hf_...``, ``grpo_hf_...``) only when it
    is not a lower-case snake_case name that happens to start like one (``my_hf_dataset_cache``)."""
    start = match.start()
    if start > 0 and match.string[start - 1] in "_.-" and _SNAKE_NAME.fullmatch(match[0]):
        return match[0]
    return REDACTED


def _auth_scheme(match: re.Match[str]) -> str:
    """``Bearer``/``Basic``/``Token`` ... and the credential after it, replaced when the credential
    is one: token68 characters (RFC 7235) and, but after ``Bearer`` or in an ``Authorization:``
    header (``Authorization: token abcdefgh``), not a plain word. Prose keeps
    ``a basic approach:``, ``special token <|endoftext|>``, ``token ids:[151643]``."""
    credential = match[2]
    header = _AFTER_AUTHORIZATION.search(match.string, max(0, match.start() - 24), match.start()) is not None
    if _TOKEN68.fullmatch(credential) is None or (not header and match[1].lower() != "bearer"
                                                  and _PROSE_WORD.fullmatch(credential) is not None):
        return match[0]
    return f"{match[1]} {REDACTED}"


def _pem(text: str) -> str:
    """Private-key PEM blocks (RSA, EC, OPENSSH, ENCRYPTED, PGP ...) replaced whole, up to their
    END line or, for a block cut short, to the end of the text."""
    if "-----BEGIN" not in text:
        return text
    out, pos = [], 0
    for match in _PEM_BEGIN.finditer(text):
        if match.start() < pos:
            continue
        label = match[1]
        if not any(w in label for w in ("PRIVATE", "SECRET", "ENCRYPTED")):
            continue
        end = text.find(f"-----END {label}-----", match.end())
        out.append(text[pos:match.start()] + REDACTED)
        pos = len(text) if end < 0 else end + len(f"-----END {label}-----")
        if pos >= len(text):
            break
    return "".join(out) + text[pos:]


_SEGMENT = re.compile(r"[A-Za-z0-9]+")
_ATOM = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # UPPER, Word or lower, digits
_SYLLABIC = re.compile(r"[A-Z]?[a-z]*[aeiou][a-z]*")
_CONSONANTS = re.compile(r"[b-df-hj-np-tv-xz]{5}", re.IGNORECASE)
_VOWELS = re.compile(r"[aeiouy]", re.IGNORECASE)
_LOWER_THEN_UPPER = re.compile(r"[a-z](?=[A-Z])")
_LONE_LOWER_THEN_UPPER = re.compile(r"(?<![a-z])[a-z](?=[A-Z])")  # the "xY" of random text, not "NeoX"
_HEX_ID = re.compile(r"(?=[a-f]*[0-9])[0-9a-f]+|(?=[A-F]*[0-9])[0-9A-F]+")
_SHORT_ONE_CASE = re.compile(r"[a-z0-9]{1,11}|[A-Z0-9]{1,11}")
_DIGIT = re.compile(r"[0-9]")
RANDOM_BREAKS = 0.15
"""Breaks per character from which a run reads as random (see :func:`_random_looking`)."""


def _pronounceable(atom: str) -> bool:
    """A word-like part of a name (``Qwen``, ``Instruct``, ``seed``): three letters or more, a vowel,
    no five consonants in a row, a quarter of its letters vowels. Random letters rarely are."""
    return (len(atom) >= 3 and _SYLLABIC.fullmatch(atom) is not None and _CONSONANTS.search(atom) is None
            and 4 * len(_VOWELS.findall(atom)) >= len(atom))


def _id_like(segment: str) -> bool:
    """A part that says nothing either way: hex with a digit (commit ids, UUID parts, digests: they
    cannot be told from a hex secret, so they are kept), one case and up to 11 characters
    (``lr1e6``, ``GRPO``, a W&B run id, a pod suffix), or a hardware or size tag of up to 10
    characters, a third digits and no lower-to-upper step (``H100x16``, ``MI300Xx8``, ``M8x7B``)."""
    if _HEX_ID.fullmatch(segment) or _SHORT_ONE_CASE.fullmatch(segment):
        return True
    return (len(segment) <= 10 and _LOWER_THEN_UPPER.search(segment) is None
            and 3 * len(_DIGIT.findall(segment)) >= len(segment))


def _evidence(segment: str) -> tuple[int, int]:
    """(breaks, characters) that one run of letters and digits adds to the evidence that its run
    is random. A break is where a name would not break: each part that is not pronounceable (a
    number, a one- or two-letter tag, a vowel-less clump, an all-caps run) after the first, and
    each lone lower-case letter before a capital (``xY``), one more per 5 letters of a long
    unpronounceable one-case run (:func:`_unreadable`). A part under 7 characters (``ReMax``,
    ``A100x8``, a piece of base64 cut by a ``/``) counts only its lower-to-upper steps."""
    if _id_like(segment):
        return 0, 0
    if len(segment) < 7:
        steps = len(_LOWER_THEN_UPPER.findall(segment))
        return (steps, len(segment)) if steps else (0, 0)
    unreadable = sum(_unreadable(atom) for atom in _ATOM.findall(segment))
    return max(0, unreadable - 1) + len(_LONE_LOWER_THEN_UPPER.findall(segment)), len(segment)


def _unreadable(atom: str) -> int:
    """Breaks one part adds: 0 for a pronounceable word, 1 for a number or a short tag, and one per
    5 letters for a long unpronounceable run of one case with many different letters
    (``xkqjzmvbwp``, ``JBSWYDPEHPK``: random lower-case or base32 text has no digit or case change
    to break it; ``xxxxxxxx`` is a filler)."""
    if len(atom) >= 6 and atom.isalpha() and (atom.islower() or atom.isupper()):
        varied = 2 * len(set(atom.lower())) >= min(len(atom), 26)  # not a filler (xxxxxxxx, abababab)
        return len(atom) // 5 if varied and not _pronounceable(atom.lower()) else 0
    return 0 if _pronounceable(atom) else 1


def _random_looking(run: str) -> bool:
    """A run of 20+ token characters that reads as random, not as a name: a key or secret of
    unknown provider. Names are words, numbers and short tags between separators
    (``Qwen2-7B_GRPO_lr1e-6_bs512``, ``runs/2024-11-05T12-30-00Z_A100x8``, ``GPTNeoXForCausalLM``);
    random text breaks every second or third character (``Kr944WdrFvxyZleHVKBJ``). From
    :data:`RANDOM_BREAKS` breaks per counted character (8 at least), 99.3% or more of random base64,
    base64url and alphanumeric strings of each length from 20 to 86 characters are caught and no
    name of the readable corpus is (the highest reads 0.08); ``tests/test_redaction.py`` measures
    both. Pure hex is kept on purpose (see :func:`_id_like`)."""
    breaks = size = 0
    for segment in _SEGMENT.findall(run):
        more, chars = _evidence(segment)
        breaks, size = breaks + more, size + chars
    return size >= 8 and breaks >= RANDOM_BREAKS * size


_DIGEST = re.compile(r"sha(?:256|384|512):[0-9a-f]")
# URI schemes with no user info: mailto:alice@example.com is an address, not alice's password
_NO_AUTHORITY = frozenset({"mailto", "sip", "sips", "xmpp", "tel", "im", "pres", "news", "urn"})


def _userinfo(token: str) -> str:
    """``[scheme://]user:password@host...`` with the password replaced (it may hold ``/`` or ``@``:
    it runs to the token's last ``@``)."""
    at = token.rfind("@")
    if at <= 0 or ":" not in token[:at] or _DIGEST.match(token, at + 1):  # image:tag@sha256:... pins a digest
        return token
    scheme = token.find("://", 0, at)
    if scheme > 0 and token[scheme - 1].isalnum():
        start = scheme + 3
    else:  # scp-style user:pass@host:path, maybe after a quote, a bracket or an '='
        start = max(token.rfind(c, 0, at) for c in "\"'([{<=,;") + 1
    colon = token.find(":", start, at)
    if colon < start or (colon == start and scheme <= 0):  # redis://:password@host: an empty user
        return token
    user, password = token[start:colon], token[colon + 1:at]
    if not password or "/" in user or password == REDACTED or (scheme < 0 and user.lower() in _NO_AUTHORITY):
        return token
    if scheme > 0 and "/" in password and password.split("/", 1)[0].isdigit():
        return token  # host:port/path@... : no user info, an '@' in the path
    return token[:colon + 1] + REDACTED + token[at:]


_SPECIAL_TOKEN = re.compile(r"<\|?/?[A-Za-z0-9_.:-]*\|?>|\[[A-Z_]+\]")  # <|endoftext|>, </s>, [MASK]
# Where the secret is kept, not the secret: ${oc.env:HF_TOKEN}, $HF_TOKEN, {{ secrets.X }}, ${{ secrets.X }}
_REFERENCE = re.compile(r"\$\{\{[^{}]*\}\}|\$\{[^{}]*\}|\$[A-Z_][A-Z0-9_]*|\{\{[^{}]*\}\}")
_LITERALS = frozenset({"none", "null", "nil", "true", "false", "yes", "no", "on", "off",  # and setting states
                       "enabled", "disabled", "required", "optional"})
_ALNUM = re.compile(r"[A-Za-z0-9]")


def _placeholder(value: str) -> bool:
    """A value that cannot be a secret, whatever name it is paired with: nothing, a marker
    without a letter or digit (the ``####`` a prompt asks the answer after), a vocabulary token
    (``special token: <|endoftext|>``, ``eos_token: </s>``), a boolean or null literal
    or a setting's state (``use_auth_token: True``, ``--hub_token None``, ``auth: required``), a reference to where the secret is kept
    (``${oc.env:HF_TOKEN}``, ``$HF_TOKEN``, ``{{ secrets.HF_TOKEN }}``), or one already redacted."""
    return (value == REDACTED or _ALNUM.search(value) is None or value.lower() in _LITERALS
            or _SPECIAL_TOKEN.fullmatch(value) is not None or _REFERENCE.fullmatch(value) is not None)


def _run_length(text: str, at: int) -> int:
    """How many name characters (letters, digits, ``_ . -``) start at ``at``."""
    match = _NAME_RUN.match(text, at)
    return 0 if match is None else len(match[0])


def _prose(text: str, value: re.Match[str]) -> bool:
    """Whether a credential's name followed by ``:`` or a space is a sentence, not a pair: the value
    is a plain word and the sentence goes on with another word that is no name of a pair
    (``Answer with a single token: yes or no``, ``Password: the user gives you ...``,
    ``the secret key to this problem``). ``password: swordfish``, ``password: hunter2 rejected``,
    ``password: swordfish host: db`` and netrc's ``password swordfish account x`` are pairs."""
    if _PROSE_WORD.fullmatch(value[0]) is None:
        return False
    after = _NEXT_WORD.match(text, value.end())
    return (after is not None and text[after.end():after.end() + 1] not in (":", "=")
            and after[0].strip().lower() not in _NETRC_KEYWORDS)


def _pairs(text: str) -> str:
    """Every value that follows a credential name replaced: ``name=value``, ``name: value``,
    ``"name": "value"``, ``--name value``, ``--name=value`` and netrc's ``password value``.

    Linear time: names are found from the credential words in them (most text has none), each
    name is read once, a value is read only after a credential's name, and names inside a value
    already replaced are skipped."""
    n = len(text)
    reverse = ""
    out: list[str] = []
    pos = scanned = 0
    # lower() keeps the length of ASCII text, so positions in it are positions in text
    triggers = _TRIGGER_LOWER.finditer(text.lower()) if text.isascii() else _TRIGGER.finditer(text)
    for trigger in triggers:
        if trigger.start() < max(pos, scanned):
            continue
        if not reverse:
            reverse = text[::-1]
        start = trigger.start() - _run_length(reverse, n - trigger.start())
        end = trigger.end() + _run_length(text, trigger.end())
        scanned = end
        name = text[start:end].lstrip(".0123456789")
        flag = name.startswith("-")
        after = text[end:end + 1]
        if after in (" ", "\t") and not (flag or name.lower() in _NETRC_WORDS or _SPACED_ASSIGN.match(text, end)):
            continue  # a name followed by a space is paired only as a flag, netrc's keyword or INI's "name = value"
        if start < pos or after not in ("=", ":", '"', "'", " ", "\t", "\\") or not is_secret_key(name):
            continue
        sep = _ASSIGN_SEP.match(text, end)
        if flag and (sep is None or text[end] != "="):
            sep = _LIST_SEP.match(text, end) or _SPACE_SEP.match(text, end)
        elif sep is None and name.lower() in _NETRC_WORDS:
            sep = _SPACE_SEP.match(text, end)
        if sep is None:
            continue
        value = _VALUE.match(text, sep.end())
        if value is None or _placeholder(value[0].strip("'\"\\")) or (flag and value[0].startswith("--")):
            continue
        if not flag and "=" not in sep[0] and _prose(text, value):
            continue
        quote = value[0][:2] if value[0][:2] == '\\"' else value[0][0] if value[0][:1] in ("'", '"') else ""
        out.append(text[pos:sep.end()] + quote + REDACTED + quote)
        pos = value.end()
    return "".join(out) + text[pos:] if out else text


def redact_text(text: str) -> str:
    """``text`` with every secret in a recognisable form replaced by :data:`REDACTED` (rule 2's
    text forms and rule 3; see the module docstring). Linear in the length of ``text``."""
    lower = text.lower()  # cheap tests first: most text holds none of what a rule looks for
    text = _pem(text)
    if "hooks.slack.com" in lower:
        text = _SLACK_WEBHOOK.sub(REDACTED, text)
    text = _PROVIDER_TOKEN.sub(_provider_token, text)
    if "Q~" in text:
        text = _AZURE_AD_SECRET.sub(REDACTED, text)
    if "-us" in text:
        text = _MAILCHIMP_KEY.sub(REDACTED, text)
    if "eyJ" in text:
        text = _JWT.sub(REDACTED, text)
    if any(w in lower for w in ("bearer", "basic", "token", "digest", "negotiate")):
        text = _AUTH_SCHEME.sub(_auth_scheme, text)
    if "@" in text:
        text = _NONSPACE.sub(lambda m: _userinfo(m[0]) if "@" in m[0] else m[0], text)
    text = _pairs(text)
    return _RUN.sub(lambda m: REDACTED if _random_looking(m[0]) else m[0], text)


# -- structures: rules 1 and 2 -------------------------------------------------------------------------

_NAME_FIELDS = frozenset({"name", "key", "id", "env", "var", "variable", "header", "field", "param",
                          "parameter", "flag", "option", "arg", "argument", "label"})
_FLAG_ITEM = re.compile(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*")


def _credential_name(value: Any) -> bool:
    return isinstance(value, str) and _FLAG_ITEM.fullmatch(value) is not None and is_secret_key(value)


def _as_mapping(value: Any) -> Mapping[Any, Any] | None:
    """Structured configs (dataclasses, argparse namespaces, pydantic models, namedtuples) as
    mappings, so that their fields are redacted by name like a dict's."""
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    for method in ("model_dump", "_asdict"):
        if callable(getattr(value, method, None)):
            out = getattr(value, method)()
            return out if isinstance(out, Mapping) else None
    if type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):
        return dict(vars(value))
    return None


def _empty(value: Any) -> bool:
    """A value under a credential's name that is kept: unset, or a placeholder (:func:`_placeholder`)."""
    return value is None or isinstance(value, bool) or (isinstance(value, str) and _placeholder(value))


def _redact_string(text: str) -> str:
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            parsed = json.loads(stripped)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, (dict, list)):
            cleaned = redact_tree(parsed)
            if cleaned != parsed:
                text = json.dumps(cleaned)
    return redact_text(text)


def redact_tree(value: Any, *, secret: bool = False) -> Any:
    """A redacted copy of ``value``: mappings (and dataclasses, namespaces, pydantic models) as
    dicts with string keys, lists and tuples as lists, bytes as text, strings redacted; scalars
    as given. ``secret`` says an enclosing key already named a credential. Keys are redacted like
    text (a token or a URI with a password used as a key). Also what error messages show of a
    user's options. A config that holds itself is a :class:`MetricsError` naming where."""
    return _redact_node(value, secret, "", Cycles("the config"))


def _redact_node(value: Any, secret: bool, path: str, cycles: Cycles) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8", errors="backslashreplace")
    mapping = _as_mapping(value)
    if mapping is not None:
        with cycles.inside(value, path):
            return _redact_mapping(mapping, secret, path, cycles)
    if isinstance(value, (list, tuple)):
        if secret and value:
            return REDACTED
        with cycles.inside(value, path):
            items = list(value)
            after_name = {i + 1 for i, item in enumerate(items[:-1])
                          if _credential_name(item) and not str(items[i + 1]).startswith("--")}
            return [_redact_node(item, i in after_name, f"{path}/{i}" if path else str(i), cycles)
                    for i, item in enumerate(items)]
    if secret and not _empty(value):
        return REDACTED
    if isinstance(value, str):
        return _redact_string(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _redact_string(str(value))


def _redact_mapping(mapping: Mapping[Any, Any], secret: bool, path: str, cycles: Cycles) -> dict[str, Any]:
    """Rule 1 on each key, rule 2 on the pairing, and each key itself redacted as text (two keys
    that read the same once redacted are told apart by a ``#2``, ``#3`` ... suffix)."""
    paired = any(str(k).lower() in _NAME_FIELDS and _credential_name(v) for k, v in mapping.items())
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        name = key_text(str(k))
        shown, n = name, 1
        while shown in out:
            n += 1
            shown = f"{name}#{n}"
        named = secret or _secret_part(str(k)) or (paired and str(k).lower() not in _NAME_FIELDS)
        out[shown] = _redact_node(v, named, f"{path}/{shown}" if path else shown, cycles)
    return out


@functools.lru_cache(maxsize=4096)
def key_text(key: str) -> str:
    """A mapping key as a record may show it: redacted like any text (rule 3 and rule 2's text forms)."""
    return redact_text(key)


def redact(key: str, value: Scalar) -> Scalar:
    """``value`` (held under ``key``) with any secret it holds replaced by :data:`REDACTED`."""
    if is_secret_key(key) and not _empty(value):
        return REDACTED
    return _redact_string(value) if isinstance(value, str) else value


def config_tree(config: Any) -> dict[str, Any]:
    """The run config as it is: nested mappings (and dataclasses, namespaces, pydantic models) as
    dicts with string keys, lists and tuples as lists, ``None`` as ``None``, non-finite floats as
    ``"inf"``/``"nan"`` (strict JSON has none), other objects as text, redacted at every depth by the
    rules of this module. What the journal header and W&B keep; MLflow flattens it (:func:`param_text`).

    >>> config_tree({"optim": {"betas": (0.9, 0.95), "sched": None}, "hub": [{"token": "hf_x"}]})
    {'optim': {'betas': [0.9, 0.95], 'sched': None}, 'hub': [{'token': '***REDACTED***'}]}
    """

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return redact_text(str(value))

    tree = plain(redact_tree(config if config is not None else {}))
    return tree if isinstance(tree, dict) else {"config": tree}


def param_text(value: Any) -> str:
    """One config value as the text of a string-only parameter (MLflow's params): scalars as Python
    writes them (``0.9``, ``True``, ``None``: what ``mlflow.log_param`` itself stores), lists and
    mappings as compact JSON (``[0.9, 0.95]``), never exploded into one parameter per item.

    >>> param_text([0.9, 0.95]), param_text(None), param_text({"a": [1, None]})
    ('[0.9, 0.95]', 'None', '{"a": [1, null]}')
    """
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False, allow_nan=True)
    return str(value)


def flatten_config(config: Any, *, sep: str = "/") -> dict[str, Scalar]:
    """Nested mappings (and dataclasses, namespaces, pydantic models), lists and tuples flattened to
    ``a/b/0`` keys, values made plain JSON-safe scalars (non-finite floats as ``"inf"``/``"nan"``),
    and redacted by the rules of this module.

    >>> flatten_config({"rl": {"kl_beta": 0.1, "max_tokens": 64}, "wandb": {"api_key": "abc"}})
    {'rl/kl_beta': 0.1, 'rl/max_tokens': 64, 'wandb/api_key': '***REDACTED***'}
    """
    out: dict[str, Scalar] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            if not value and prefix:
                out[prefix] = "{}"
            for k, v in value.items():
                walk(f"{prefix}{sep}{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            if not value:
                out[prefix] = "[]"
            for i, v in enumerate(value):
                walk(f"{prefix}{sep}{i}", v)
        elif isinstance(value, float) and not math.isfinite(value):
            out[prefix] = str(value)  # strict JSON has no inf/nan; the text is exact
        elif value is None:
            out[prefix] = "None"
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = redact_text(str(value))

    walk("", redact_tree(config))
    return out
