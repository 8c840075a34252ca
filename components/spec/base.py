"""What the sections of the spec share: the base model, the name and image patterns, the pinned-source rules, and
``every_problem``, which runs each of a section's checks so a section hears of all its mistakes."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from functools import partial
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from runtime.revision import HUB_COMMIT as HUB_COMMIT  # noqa: PLC0414 - re-exported: the spec's name for it
from runtime.revision import is_pinned_revision as is_pinned_revision  # noqa: PLC0414 - re-exported

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
AWS_ACCOUNT = re.compile(r"^\d{12}$")
PINNED_IMAGE = re.compile(r"^[^\s@]+(@sha256:[0-9a-f]{64}|:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")
# Tags that move by convention; an image pinned to one of these is not pinned (the policy pack reuses this).
MOVING_TAGS = frozenset(
    {"latest", "main", "master", "stable", "edge", "nightly", "dev", "develop", "head", "canary"}
)
MAX_MODEL_NAME = 40  # leaves room for suffixes in 63-character Kubernetes names
MAX_EKS_CLUSTER_NAME = 40  # leaves room for suffixes in 64-character IAM role names


def is_local_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~"))


def is_hub_source(source: str) -> bool:
    """A Hugging Face repository id: not an S3 URI, not a local path (models, versions and adapters alike)."""
    return not source.startswith("s3://") and not is_local_path(source)


def is_pinned_source(source: str, revision: object) -> bool:
    """A source that cannot change under the same spec: an S3 prefix or a directory (pinned by its path, a new one
    per version), or a hub repository at a commit (``is_pinned_revision``). Models, versions and adapters alike."""
    return not is_hub_source(source) or is_pinned_revision(revision)


def hub_commit(revision: str) -> str:
    """A hub revision, which must be a commit (``is_pinned_revision``): a branch or tag moves, and every replica
    must serve the same bytes."""
    if not is_pinned_revision(revision):
        raise ValueError(
            f"{revision!r} is not a commit hash: pin the exact hub commit (40 hex digits, from the repository's "
            "commit history), never a branch or tag that moves"
        )
    return revision


HubCommit = Annotated[str, AfterValidator(hub_commit)]
"""The revision of a hub source (a model's, a version's, an adapter's): one rule for all three."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


def every_problem(section: str, *checks: Callable[[], object]) -> None:
    """Run every check of a section (each raises ValueError at its first problem) and raise what they all found, one
    error each: pydantic runs a model's validators in turn and stops at the first that raises, so a section with
    mistakes in two of its parts would hear of one."""
    found: list[str] = []
    for check in checks:
        try:
            check()
        except ValidationError:
            raise  # already located errors (none of the checks raise one): not a check's message
        except ValueError as err:
            found.append(str(err))
    if found:
        raise ValidationError.from_exception_data(
            section,
            [
                InitErrorDetails(
                    type=PydanticCustomError("value_error", "{problem}", {"problem": message}),
                    loc=(),
                    input=None,
                )
                for message in found
            ],
        )


AUTO = "auto"


def _dns_label(value: str) -> str:
    if not DNS_LABEL.match(value) or len(value) > MAX_MODEL_NAME:
        raise ValueError(
            f"{value!r} is not a DNS label: use lowercase letters, digits and '-', starting and ending "
            f"with a letter or digit, at most {MAX_MODEL_NAME} characters (e.g. 'llama-3-70b')"
        )
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]


def _pinned_image(value: str) -> str:
    last = value.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last and "@" not in value else ""
    if not PINNED_IMAGE.match(value) or tag.lower() in MOVING_TAGS:
        raise ValueError(
            f"image {value!r} is not pinned: give an immutable tag or a digest, "
            "e.g. 'vllm/vllm-openai:v0.32.0' or 'repo/image@sha256:<64 hex>' "
            f"(never a moving tag such as {', '.join(sorted(MOVING_TAGS)[:4])}, ...)"
        )
    return value


PinnedImage = Annotated[str, AfterValidator(_pinned_image)]


def _aws_account(value: str) -> str:
    if not AWS_ACCOUNT.match(value):
        raise ValueError(f"{value!r} is not an AWS account id; write its 12 digits, e.g. '123456789012'")
    return value


AwsAccount = Annotated[str, AfterValidator(_aws_account)]


def _checked_cidr(value: str, *, ipv4_only: bool) -> str:
    try:
        (ipaddress.IPv4Network if ipv4_only else ipaddress.ip_network)(value)
    except ValueError:
        what, example = (
            ("an IPv4 CIDR block", "203.0.113.0/24") if ipv4_only else ("a CIDR block", "10.0.0.0/16")
        )
        raise ValueError(f"{value!r} is not {what}; write e.g. '{example}'") from None
    return value


def _all_match(values: list[str], pattern: str, what: str, example: str) -> list[str]:
    """``values`` when each matches ``pattern``; else one message listing those that do not."""
    bad = [v for v in values if not re.fullmatch(pattern, v)]
    if bad:
        raise ValueError(f"{', '.join(map(repr, bad))} not {what}; write {example}")
    return values


Cidr = Annotated[str, AfterValidator(partial(_checked_cidr, ipv4_only=False))]
Ipv4Cidr = Annotated[str, AfterValidator(partial(_checked_cidr, ipv4_only=True))]


def _checked_source(value: str, what: str = "model") -> str:
    """A Hugging Face repo id, an S3 URI or a local path (the same rules for weights and adapters)."""
    if value.startswith("s3://"):
        if not S3_URI.match(value):
            raise ValueError(f"{value!r} is not a valid S3 URI; write 's3://<bucket>/<prefix>'")
        return value
    if value.startswith(("/", "./", "../", "~")):
        return value
    if not HF_REPO.match(value):
        raise ValueError(
            f"{value!r} is not a {what} source: use a Hugging Face repo id like 'meta-llama/Llama-3.1-8B-Instruct', "
            f"an S3 URI like 's3://models/llama-3.1-8b/', or a local path starting with '/' or './'"
        )
    return value
