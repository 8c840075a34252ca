"""Security: pinned images and charts, no privileged or root containers, no plaintext secrets, network
policies everywhere, authenticated public ingress, private encrypted S3, no admin IAM, encrypted EKS
secrets, a production API endpoint that is private or limited to an allow-list."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

from components.core.cloud import BATCH_DATA, DATA_TAG, ENGINE_WORKLOAD, MODEL_DATA, WORKLOAD_TAG
from components.spec import MOVING_TAGS
from policies.inference.rules.base import (
    SECRET,
    Category,
    Config,
    Finding,
    Res,
    Rule,
    Setting,
    Severity,
    as_list,
    as_map,
    dig,
    of_kind,
    of_type,
    strings,
)
from policies.inference.rules.engines import engines
from policies.inference.rules.k8s import containers, environment_of, pod_spec, workloads
from policies.inference.rules.reliability import ENVIRONMENTS_SCHEMA
from runtime.engines import TELEMETRY_OFF_ENV

CHART = "kubernetes:helm.sh/v4:Chart"
CHARTS = (CHART, "kubernetes:helm.sh/v3:Chart", "kubernetes:helm.sh/v3:Release")
DOCKER_IMAGE = "docker-build:index:Image"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
MUTABLE_TAGS = sorted(MOVING_TAGS)


def image_problem(image: str, mutable: Sequence[str]) -> str | None:
    """Why an image reference is not pinned, or None when it is (a digest, or a tag not known to move)."""
    if DIGEST.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag, so it means ':latest'"
    tag = last.rsplit(":", 1)[1]
    if tag.lower() in {m.lower() for m in mutable}:
        return f"uses the moving tag ':{tag}'"
    return None


def _chart_images(values: Any, path: str = "values") -> Iterator[tuple[str, str]]:
    """(path, image reference) pairs in Helm values: 'image: repo:tag' or {repository, tag, digest}."""
    if isinstance(values, Mapping):
        for key, value in values.items():
            here = f"{path}.{key}"
            if key == "image" and isinstance(value, str):
                yield here, value
            elif key == "image" and isinstance(value, Mapping) and value.get("repository"):
                repo = (
                    f"{value.get('registry')}/{value['repository']}"
                    if value.get("registry")
                    else value["repository"]
                )
                if value.get("digest"):
                    yield here, f"{repo}@{value['digest']}"
                elif "tag" in value:
                    yield here, f"{repo}:{value['tag']}" if value.get("tag") else str(repo)
            else:
                yield from _chart_images(value, here)
    elif isinstance(values, list):
        for i, value in enumerate(values):
            yield from _chart_images(value, f"{path}[{i}]")


def _images(res: Res, config: Config) -> Iterator[str]:
    mutable = list(config["mutable_tags"])
    fix = (
        "pin it by digest (repo/image@sha256:...) or an immutable release tag (e.g. vllm/vllm-openai:v0.32.0)"
    )
    pod = pod_spec(res)
    if pod is not None:
        for c in containers(pod):
            if c.image is None:
                continue
            problem = image_problem(c.image, mutable)
            if problem:
                yield f"{res.display}: container {c.name} image {c.image!r} {problem}; {fix}"
    if res.type in CHARTS:
        for where, image in _chart_images(res.props.get("values")):
            problem = image_problem(image, mutable)
            if problem:
                yield f"Helm chart {res.name}: {where} {image!r} {problem}; {fix}, or drop the override"
    if res.type == DOCKER_IMAGE:
        for tag in as_list(res.props.get("tags")):
            if isinstance(tag, str) and image_problem(tag, mutable):
                yield f"image build {res.name}: pushes {tag!r}, a moving tag; push a content or version tag"


IMAGES_PINNED = Rule(
    name="images-pinned",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="Every container image (workloads, init containers, Helm chart value overrides, image builds) "
    "is pinned by digest or by an immutable tag; never ':latest' or no tag.",
    remediation="Use 'repo/image@sha256:<digest>' or a release tag such as 'vllm/vllm-openai:v0.32.0'.",
    resource_check=_images,
    settings=(
        Setting(
            "mutable_tags",
            {"type": "array", "items": {"type": "string"}},
            MUTABLE_TAGS,
            "Tags treated as moving (case-insensitive).",
        ),
    ),
)

_EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")


def _charts(res: Res, config: Config) -> Iterator[str]:
    if res.type not in CHARTS:
        return
    version = res.props.get("version")
    if not isinstance(version, str) or not _EXACT_VERSION.match(version):
        shown = repr(version) if version else "no version"
        yield (
            f"Helm chart {res.name} ({res.props.get('chart')}): {shown} is not an exact chart version, so each "
            "deploy may install a different chart; set addons.versions to an exact version such as '2.17.1'"
        )


CHARTS_PINNED = Rule(
    name="helm-charts-pinned",
    category=Category.SECURITY,
    severity=Severity.MEDIUM,
    description="Every Helm chart is installed at an exact version (no range, no 'latest').",
    remediation="Set the chart version to an exact release, e.g. '2.17.1'.",
    resource_check=_charts,
)


def _root(res: Res, config: Config) -> Iterator[str]:
    pod = pod_spec(res)
    if pod is None:
        return
    workload = f"{res.namespace}/{res.k8s_name}"
    if any(fnmatch.fnmatchcase(workload, pattern) for pattern in config["allowed_workloads"]):
        return
    fix = "set securityContext runAsNonRoot: true, runAsUser >= 1000, privileged: false"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key) is True:
            yield f"{res.display}: {key}: true shares the node's namespaces; remove it (or allow-list {workload})"
    pod_ctx = as_map(pod.get("securityContext"))
    for c in containers(pod):
        ctx = as_map(c.props.get("securityContext"))
        if ctx.get("privileged") is True:
            yield f"{res.display}: container {c.name} is privileged; {fix} (or allow-list {workload})"
        if ctx.get("allowPrivilegeEscalation") is True:
            yield f"{res.display}: container {c.name} allows privilege escalation; set allowPrivilegeEscalation: false"
        added = [str(a) for a in as_list(dig(ctx, "capabilities", "add"))]
        if {"SYS_ADMIN", "ALL", "NET_ADMIN"} & {a.upper() for a in added}:
            yield f"{res.display}: container {c.name} adds capabilities {added}; drop them ({fix})"
        user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
        non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
        if user == 0:
            yield f"{res.display}: container {c.name} runs as user 0 (root); {fix}"
        elif non_root is not True and not (isinstance(user, int | float) and user > 0):
            yield (
                f"{res.display}: container {c.name} may run as root (neither runAsNonRoot: true nor a non-zero "
                f"runAsUser at pod or container level); {fix}"
            )


NO_ROOT = Rule(
    name="no-privileged-or-root-containers",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="No container is privileged, escalates privileges, adds admin capabilities or may run as root, "
    "and no pod shares the host's network/PID/IPC namespaces, outside an allow-list.",
    remediation="Set runAsNonRoot: true and a non-zero runAsUser; drop privileged and added capabilities.",
    resource_check=_root,
    settings=(
        Setting(
            "allowed_workloads",
            {"type": "array", "items": {"type": "string"}},
            [
                "kube-system/*",
                "*/*nvidia-device-plugin*",
                "*/*gpu-operator*",
                "*/*dcgm-exporter*",
                "*/*node-exporter*",
            ],
            "Workloads allowed to run privileged or as root, as 'namespace/name' glob patterns (default: the "
            "add-ons that need the host by design: device plugin, GPU operator, DCGM and node exporters).",
        ),
    ),
)

SECRET_NAME = re.compile(
    r"(?i)^(.*[_.-])?(api[_-]?keys?|(hf|hugging[_-]?face([_-]?hub)?|auth|access|bearer|github|openai|id|refresh)[_-]?token"
    r"|token|secret|secret[_-]?(access[_-]?)?key|password|passwd|credentials?|private[_-]?key|access[_-]?key)$"
)
SECRET_VALUE = re.compile(
    r"\bhf_[A-Za-z0-9]{30,}\b|\bsk-[A-Za-z0-9_-]{20,}\b|\bAKIA[0-9A-Z]{16}\b|\bgh[pous]_[A-Za-z0-9]{36}\b"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--hf_token", "--api_key")


def _names_secret(key: str) -> bool:
    """A key or variable name that holds a credential: API_KEY, hf_token, adminPassword, clientSecret."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)
    return bool(SECRET_NAME.match(snake)) and not key.lower().startswith("existing")


def _is_reference(value: str) -> bool:
    return value.startswith(("/", "./", "http://", "https://", "${", "$(")) or value == ""


def _secret_keys(value: Any, path: str, *, pulumi_secrets_ok: bool = False) -> Iterator[str]:
    """Paths of keys that name a secret and hold inline material (non-empty strings, lists or maps).

    Keys that name a Secret object rather than hold one ('existingSecret', 'existing_secret') do not count.
    With ``pulumi_secrets_ok`` (Helm values: Helm keeps release values in a Secret), a Pulumi secret does not
    count either.
    """
    if isinstance(value, Mapping):
        for key, inner in value.items():
            here = f"{path}.{key}" if path else str(key)
            named = _names_secret(str(key))
            material = (isinstance(inner, str) and not _is_reference(inner)) or (
                isinstance(inner, list | dict) and bool(inner)
            )
            if named and material and not (pulumi_secrets_ok and inner == SECRET):
                yield here
            else:
                yield from _secret_keys(inner, here, pulumi_secrets_ok=pulumi_secrets_ok)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _secret_keys(inner, f"{path}[{i}]", pulumi_secrets_ok=pulumi_secrets_ok)


# libyaml's safe loader builds the same objects as PyYAML's (the same constructor) ten times faster: every
# ConfigMap of a plan is parsed here, and with many models that was most of the policy pack's time.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (above)
    except yaml.YAMLError:
        return None


def _plaintext(res: Res, config: Config) -> Iterator[str]:
    fix = "keep it in a Kubernetes Secret (a Pulumi secret in config) and mount it as a file or use secretKeyRef"
    pod = pod_spec(res)
    if pod is not None:
        for c in containers(pod):
            for item in as_list(c.props.get("env")):
                env = as_map(item)
                name, value = str(env.get("name", "")), env.get("value")
                if isinstance(value, str) and (
                    (_names_secret(name) and not _is_reference(value)) or SECRET_VALUE.search(value)
                ):
                    shown = "a Pulumi secret" if value == SECRET else "a literal"
                    yield f"{res.display}: container {c.name} env {name} holds {shown} in the pod spec; {fix}"
            argv = [str(a) for a in as_list(c.props.get("command")) + as_list(c.props.get("args"))]
            for i, arg in enumerate(argv):
                flag = arg.split("=", 1)[0]
                inline = "=" in arg or (i + 1 < len(argv) and not argv[i + 1].startswith("-"))
                if (flag in SECRET_FLAGS and inline) or SECRET_VALUE.search(arg):
                    yield f"{res.display}: container {c.name} passes a secret on its command line ({flag}); {fix}"
    if res.kind == "ConfigMap":
        for key, text in as_map(res.props.get("data")).items():
            if not isinstance(text, str):
                continue
            if (_names_secret(str(key)) and not _is_reference(text)) or SECRET_VALUE.search(text):
                yield f"{res.display}: data[{key}] looks like a credential; {fix}"
                continue
            for path in _secret_keys(_parsed(text), ""):
                yield f"{res.display}: data[{key}] sets {path} inline; {fix}"
    if res.type in CHARTS:
        for path in _secret_keys(res.props.get("values"), "values", pulumi_secrets_ok=True):
            yield f"Helm chart {res.name}: {path} is a credential in plain values; {fix} and reference it"
        for text in strings(res.props.get("values")):
            if SECRET_VALUE.search(text):
                yield f"Helm chart {res.name}: a value looks like a token or key; {fix}"
                break


PLAINTEXT = Rule(
    name="no-plaintext-secrets",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="No API key, Hugging Face token, password or private key sits in a container's env value or "
    "command line, a ConfigMap, or Helm values; secrets live in Secrets and are mounted or referenced.",
    remediation="Move the value to a Pulumi secret rendered into a Kubernetes Secret; mount it as a file "
    "(e.g. HF_TOKEN_PATH) or use valueFrom.secretKeyRef.",
    resource_check=_plaintext,
)


def _network(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    exempt = set(config["exempt_namespaces"])
    addon = {str(r.props.get("namespace")) for r in of_type(resources, *CHARTS) if r.props.get("namespace")}
    namespaces: dict[str, str | None] = {}
    for r in of_kind(resources, "Namespace"):
        if r.k8s_name not in addon or config["include_addon_namespaces"]:
            namespaces.setdefault(r.k8s_name, r.urn)
    for r, _ in workloads(resources):
        if r.namespace and not r.from_chart:
            namespaces.setdefault(r.namespace, r.urn)
    policies = of_kind(resources, "NetworkPolicy")
    for ns, urn in sorted(namespaces.items()):
        if ns in exempt:
            continue
        covering = [
            p
            for p in policies
            if p.namespace == ns
            and not as_map(dig(p.props, "spec", "podSelector"))
            and "Ingress" in as_list(dig(p.props, "spec", "policyTypes"))
        ]
        if not covering:
            yield Finding(
                f"namespace {ns}: no NetworkPolicy with an empty podSelector covers it, so any pod in the cluster "
                "can reach its pods; add a default-deny NetworkPolicy (podSelector: {}, policyTypes: [Ingress, "
                "Egress]) and allow only the traffic each component needs",
                urn,
            )


NETWORK = Rule(
    name="namespaces-have-network-policy",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="Every namespace the stack creates or runs workloads in has a NetworkPolicy that selects all "
    "its pods (podSelector: {}) for ingress. Namespaces that only hold Helm add-ons are skipped unless "
    "include_addon_namespaces is set: their charts own that traffic.",
    remediation="Add a default-deny NetworkPolicy in the namespace and explicit allows per component.",
    stack_check=_network,
    settings=(
        Setting(
            "exempt_namespaces",
            {"type": "array", "items": {"type": "string"}},
            ["kube-system", "kube-public", "kube-node-lease"],
            "Namespaces never checked.",
        ),
        Setting(
            "include_addon_namespaces",
            {"type": "boolean"},
            False,
            "Also require a NetworkPolicy in namespaces whose only pods come from Helm charts.",
        ),
    ),
)

_INTERNAL = {
    "alb.ingress.kubernetes.io/scheme": "internal",
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
    "networking.gke.io/load-balancer-type": "Internal",
}


def _is_internal(res: Res) -> bool:
    annotations = as_map(res.metadata.get("annotations"))
    return any(str(annotations.get(k, "")).lower() == v.lower() for k, v in _INTERNAL.items())


def _exposed_services(res: Res) -> list[str]:
    """Services a public entry point sends traffic to."""
    if res.kind == "Ingress":
        spec = as_map(res.props.get("spec"))
        names = [dig(spec, "defaultBackend", "service", "name")]
        for rule in as_list(spec.get("rules")):
            for path in as_list(dig(rule, "http", "paths")):
                names.append(dig(path, "backend", "service", "name"))
        return [str(n) for n in names if n]
    if res.kind == "HTTPRoute":
        return [
            str(as_map(b).get("name"))
            for rule in as_list(dig(res.props, "spec", "rules"))
            for b in as_list(as_map(rule).get("backendRefs"))
            if as_map(b).get("name")
        ]
    if res.kind == "Service" and dig(res.props, "spec", "type") in ("LoadBalancer", "NodePort"):
        return [res.k8s_name]
    return []


def _runtime_sections(resources: Sequence[Res], section: str) -> list[tuple[Res, Mapping[str, Any]]]:
    """The ``section`` (router, picker) of every runtime config a ConfigMap holds."""
    out = []
    for r in of_kind(resources, "ConfigMap"):
        for text in as_map(r.props.get("data")).values():
            doc = _parsed(text) if isinstance(text, str) else None
            settings = as_map(as_map(doc).get(section))
            if settings and "require_api_key" in settings:
                out.append((r, settings))
    return out


def router_configs(resources: Sequence[Res]) -> list[tuple[Res, Mapping[str, Any]]]:
    return _runtime_sections(resources, "router")


def _pool_backends(res: Res) -> list[str]:
    """The InferencePools an HTTPRoute sends to: their endpoint picker is what sees each request."""
    if res.kind != "HTTPRoute":
        return []
    return [
        str(as_map(b).get("name"))
        for rule in as_list(dig(res.props, "spec", "rules"))
        for b in as_list(as_map(rule).get("backendRefs"))
        if as_map(b).get("kind") == "InferencePool" and as_map(b).get("name")
    ]


def _picker_checks_keys(resources: Sequence[Res], namespace: str | None) -> bool:
    """A picker in ``namespace`` requires API keys from a key file (the router's check, at the gateway)."""
    return any(
        c.namespace == namespace
        and picker.get("require_api_key") is True
        and bool(picker.get("api_keys_file"))
        for c, picker in _runtime_sections(resources, "picker")
    )


def _public_auth(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    routers = router_configs(resources)
    router_services = set(config["router_services"])
    for r in resources:
        if r.kind not in ("Ingress", "HTTPRoute", "Service") or (r.kind != "HTTPRoute" and _is_internal(r)):
            continue
        targets = _exposed_services(r)
        pools = _pool_backends(r)
        if pools:
            if not _picker_checks_keys(resources, r.namespace):
                yield Finding(
                    f"{r.display}: sends public traffic to {', '.join(pools)}, but their endpoint picker does not "
                    "require API keys, and nothing else in this mode checks them; set gateway.require_api_key: "
                    "true and gateway.api_keys_config_key (a Pulumi secret)",
                    r.urn,
                )
                continue
            targets = [t for t in targets if t not in pools]
        if not targets:
            continue
        bypass = [t for t in targets if not any(t.endswith(s) for s in router_services)]
        if bypass:
            yield Finding(
                f"{r.display}: exposes {', '.join(bypass)} publicly without the router, which is where API keys "
                "are checked; route public traffic to the router service only (or make it internal)",
                r.urn,
            )
            continue
        open_routers = [
            c
            for c, router in routers
            if c.namespace == r.namespace
            and not (
                router.get("require_api_key") is True
                and (router.get("api_keys_file") or router.get("api_keys"))
            )
        ]
        if open_routers or not routers:
            yield Finding(
                f"{r.display}: is public, but the router in {r.namespace} does not require API keys; set "
                "gateway.require_api_key: true and gateway.api_keys_config_key (a Pulumi secret), or make the "
                "ingress internal",
                r.urn,
            )


PUBLIC_AUTH = Rule(
    name="public-ingress-requires-api-key",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="A public entry point (internet-facing Ingress, HTTPRoute, LoadBalancer/NodePort Service) only "
    "sends traffic to the router, and that router requires API keys from a mounted key file; or, in "
    "inference-extension mode, an HTTPRoute to InferencePools whose endpoint picker requires them so.",
    remediation="Set gateway.require_api_key: true with gateway.api_keys_config_key, or make the ingress internal.",
    stack_check=_public_auth,
    settings=(
        Setting(
            "router_services",
            {"type": "array", "items": {"type": "string"}},
            ["-router"],
            "Suffixes of Service names that are the authenticating router.",
        ),
    ),
)

BUCKET = "aws:s3/bucket:Bucket"
BUCKET_V2 = "aws:s3/bucketV2:BucketV2"
SSE = ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
       "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2")  # fmt: skip
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def _belongs(child: Res, bucket: Res) -> bool:
    """A bucket's companion resource: its `bucket` input is the bucket's id or name, or it shares the name."""
    ref = child.props.get("bucket")
    keys = {f"{bucket.name}-id", bucket.name, str(bucket.props.get("bucket") or "")} - {""}
    return (isinstance(ref, str) and ref in keys) or (ref is None and child.name == bucket.name)


def _s3(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    for b in of_type(resources, BUCKET, BUCKET_V2):
        inline_sse = bool(as_map(b.props.get("serverSideEncryptionConfiguration")))
        sse = [r for r in of_type(resources, *SSE) if _belongs(r, b)]
        if not sse and not inline_sse:
            yield Finding(
                f"S3 bucket {b.name}: no default encryption; add a BucketServerSideEncryptionConfiguration "
                "(aws:kms or AES256)",
                b.urn,
            )
        blocks = [r for r in of_type(resources, PAB) if _belongs(r, b)]
        if not blocks:
            yield Finding(
                f"S3 bucket {b.name}: no BucketPublicAccessBlock; add one with all four settings true", b.urn
            )
        for block in blocks:
            off = [f for f in PAB_FLAGS if block.props.get(f) is not True]
            if off:
                yield Finding(
                    f"S3 bucket {b.name}: public access block leaves {', '.join(off)} off; set them to true",
                    block.urn,
                )
        acl = b.props.get("acl")
        if isinstance(acl, str) and acl.startswith("public"):
            yield Finding(f"S3 bucket {b.name}: acl {acl!r} makes it public; remove the ACL", b.urn)


S3 = Rule(
    name="s3-buckets-encrypted-private",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="Every S3 bucket has default server-side encryption and a public access block with all four "
    "settings on, and no public ACL.",
    remediation="Add BucketServerSideEncryptionConfiguration and BucketPublicAccessBlock (all true) for the bucket.",
    stack_check=_s3,
)

_POLICY_DOCS = {
    "aws:iam/policy:Policy": ("policy",),
    "aws:iam/rolePolicy:RolePolicy": ("policy",),
    "aws:iam/userPolicy:UserPolicy": ("policy",),
    "aws:iam/groupPolicy:GroupPolicy": ("policy",),
}
_ATTACHMENTS = (
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment",
    "aws:iam/policyAttachment:PolicyAttachment",
)
ADMIN_POLICIES = ("arn:aws:iam::aws:policy/AdministratorAccess", "arn:aws:iam::aws:policy/IAMFullAccess")


def _statements(document: Any) -> list[Mapping[str, Any]]:
    doc = _parsed(document) if isinstance(document, str) else document
    return [as_map(s) for s in (as_list(as_map(doc).get("Statement")) or [as_map(doc).get("Statement")]) if s]


def _iam(res: Res, config: Config) -> Iterator[str]:
    documents: list[tuple[str, Any]] = []
    if res.type in _POLICY_DOCS:
        documents.append(("policy", res.props.get("policy")))
    if res.type == "aws:iam/role:Role":
        for p in as_list(res.props.get("inlinePolicies")):
            documents.append((f"inline policy {as_map(p).get('name')}", as_map(p).get("policy")))
    for where, document in documents:
        for s in _statements(document):
            if s.get("Effect") != "Allow":
                continue
            actions = [str(a) for a in (as_list(s.get("Action")) or [s.get("Action")])]
            resources = [str(r) for r in (as_list(s.get("Resource")) or [s.get("Resource")])]
            if {"*", "*:*"} & set(actions) and "*" in resources:
                sid = f" statement {s.get('Sid')}" if s.get("Sid") else ""
                yield (
                    f"{res.display}: {where}{sid} allows every action on every resource; list the actions and "
                    "resources the role needs"
                )
    if res.type in _ATTACHMENTS and res.props.get("policyArn") in ADMIN_POLICIES:
        yield f"{res.display}: attaches {res.props['policyArn']}; attach a least-privilege policy instead"


IAM = Rule(
    name="iam-no-wildcard-admin",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="No IAM policy allows Action '*' on Resource '*', and no role, user or group gets "
    "AdministratorAccess or IAMFullAccess.",
    remediation="Grant the specific actions on the specific ARNs the workload needs.",
    resource_check=_iam,
)

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
POLICY = "aws:iam/policy:Policy"
ROLE_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
POLICY_ATTACHMENT = "aws:iam/policyAttachment:PolicyAttachment"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
_PARTITIONS = ("aws", "aws-cn", "aws-us-gov")
#: A key no store prefix starts with: a pattern that covers it covers every object of the bucket.
_OUTSIDE_ANY_PREFIX = "\x7finferstack-probe"
#: AWS managed policies that read (or write) every object of every bucket: as if they granted s3:* on '*'.
ALL_BUCKETS_POLICIES = frozenset(
    {
        "AmazonS3ReadOnlyAccess",
        "AmazonS3FullAccess",
        "ReadOnlyAccess",
        "PowerUserAccess",
        "AdministratorAccess",
    }
)
_AWS_MANAGED = re.compile(r"arn:aws(?:-cn|-us-gov)?:iam::aws:policy/(?:.*/)?([^/]+)")
#: The name Pulumi gives a resource without an explicit one: its logical name and 7 hex digits.
_AUTONAME = "-[0-9a-f]{7}"


def _covers(pattern: str, arn: str) -> bool:
    """IAM's wildcards (``*``, ``?``) in ``pattern`` match ``arn`` in some partition (nothing else is special)."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return any(
        re.fullmatch(regex, arn.replace("arn:aws:", f"arn:{p}:", 1), re.DOTALL) is not None
        for p in _PARTITIONS
    )


def _reaches_bucket(pattern: str, bucket: str) -> bool:
    """``pattern`` names the bucket or any object in it: its bucket part (up to the first '/') covers the bucket."""
    head = pattern.split("/", 1)[0] if ":::" in pattern else pattern
    arn = f"arn:aws:s3:::{bucket}"
    return _covers(head, arn) or _covers(pattern, arn) or _covers(pattern, f"{arn}/{_OUTSIDE_ANY_PREFIX}")


def _tagged(resources: Sequence[Res], type_: str | tuple[str, ...], tag: str, value: str) -> list[Res]:
    types = (type_,) if isinstance(type_, str) else type_
    return [r for r in of_type(resources, *types) if as_map(r.props.get("tags")).get(tag) == value]


def _named(res: Res, ref: str) -> bool:
    """``ref`` (a name, an id or the last part of an ARN) is ``res``: its explicit name, its logical name or id, or
    the name Pulumi generates from the logical name when none is given."""
    explicit = res.props.get("name")
    if isinstance(explicit, str) and explicit:
        return ref in {explicit, res.name, f"{res.name}-id"}
    return (
        ref in {res.name, f"{res.name}-id"} or re.fullmatch(re.escape(res.name) + _AUTONAME, ref) is not None
    )


def _arn_names(res: Res, arn: str, kind: str) -> bool:
    """``arn`` is the ARN of ``res``, an IAM resource of ``kind`` (role, policy), possibly under a path."""
    head, sep, tail = arn.partition(f":{kind}/")
    return bool(sep) and head.startswith("arn:") and _named(res, tail.rsplit("/", 1)[-1])


def _engine_accounts(resources: Sequence[Res]) -> set[tuple[str, str]]:
    """(namespace, service account) of every engine workload: whatever role those accounts assume is an engine's."""
    return {
        (e.res.namespace or "default", str(e.pod.get("serviceAccountName") or "default"))
        for e in engines(resources)
    }


def _assumed_by_engines(resources: Sequence[Res]) -> Iterator[tuple[Res, str]]:
    """Roles the engines' service accounts assume (EKS Pod Identity or an IRSA annotation), with how.

    A Pod Identity association's roleArn is unknown while a preview creates the role: then the association
    names its role by the stack's convention (both take the same logical name, ``components.clouds.aws.layer``).
    """
    accounts = _engine_accounts(resources)
    roles = of_type(resources, ROLE)
    for association in of_type(resources, POD_IDENTITY):
        account = (str(association.props.get("namespace")), str(association.props.get("serviceAccount")))
        if account not in accounts:
            continue
        arn = association.props.get("roleArn")
        how = f"the engines' service account {account[0]}/{account[1]} (Pod Identity {association.name})"
        for role in roles:
            if (isinstance(arn, str) and _arn_names(role, arn, "role")) or (
                arn is None and role.name == association.name
            ):
                yield role, how
    for account_res in of_kind(resources, "ServiceAccount"):
        account = (account_res.namespace or "default", account_res.k8s_name)
        arn = as_map(account_res.metadata.get("annotations")).get(IRSA_ANNOTATION)
        if account in accounts and isinstance(arn, str):
            for role in roles:
                if _arn_names(role, arn, "role"):
                    yield role, f"the engines' service account {account[0]}/{account[1]} (IRSA)"


def _attached(resources: Sequence[Res], role: Res) -> Iterator[tuple[Res, str | None]]:
    """The policy ARNs attached to ``role`` (None: not known yet), with the resource that attaches each: its
    managedPolicyArns, RolePolicyAttachments and PolicyAttachments naming it (while a preview does not know the
    role's name yet, the RolePolicyAttachments ServiceRole names after it)."""
    for arn in as_list(role.props.get("managedPolicyArns")):
        yield role, arn if isinstance(arn, str) else None
    for attachment in of_type(resources, ROLE_ATTACHMENT):
        ref = attachment.props.get("role")
        if (isinstance(ref, str) and _named(role, ref)) or (
            ref is None and attachment.name.startswith(f"{role.name}-")
        ):
            arn = attachment.props.get("policyArn")
            yield attachment, arn if isinstance(arn, str) else None
    for attachment in of_type(resources, POLICY_ATTACHMENT):
        if any(isinstance(ref, str) and _named(role, ref) for ref in as_list(attachment.props.get("roles"))):
            arn = attachment.props.get("policyArn")
            yield attachment, arn if isinstance(arn, str) else None


def _role_documents(resources: Sequence[Res], role: Res) -> Iterator[tuple[Res, str, Any]]:
    """Every policy document a role holds: its inline policies, the RolePolicy resources naming it (by id or
    name; while a preview does not know the id yet, by the logical name ServiceRole gives them), and the policies
    attached to it: the stack's own (every one of them when the attached ARN is not known yet, as in a preview
    creating the policy) and the AWS managed policies that reach every bucket."""
    for p in as_list(role.props.get("inlinePolicies")):
        yield role, f"inline policy {as_map(p).get('name')}", as_map(p).get("policy")
    for policy in of_type(resources, ROLE_POLICY):
        ref = policy.props.get("role")
        if (isinstance(ref, str) and _named(role, ref)) or (
            ref is None and policy.name.startswith(f"{role.name}-")
        ):
            yield policy, "policy", policy.props.get("policy")
    for attachment, arn in _attached(resources, role):
        managed = _AWS_MANAGED.fullmatch(arn) if arn is not None else None
        if managed is not None:
            if managed.group(1) in ALL_BUCKETS_POLICIES:
                grant = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
                yield attachment, f"attached AWS managed policy {arn}", {"Statement": [grant]}
            continue
        for policy in of_type(resources, POLICY):
            if arn is None:
                yield (
                    policy,
                    f"policy (maybe the one {attachment.display} attaches: its ARN is not known yet)",
                    policy.props.get("policy"),
                )
            elif _arn_names(policy, arn, "policy"):
                yield policy, f"policy (attached by {attachment.display})", policy.props.get("policy")


def _listed(statement: Mapping[str, Any], key: str) -> list[str]:
    value = statement.get(key)
    return [str(v) for v in (as_list(value) or ([value] if value is not None else []))]


def _s3_resources(statement: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The resources an Allow statement grants S3 actions on, each as a pattern and how it reads (none when it
    grants no S3 action). NotAction grants every action it does not list; NotResource every resource it does not
    list, judged as '*' (list the resources instead)."""
    if statement.get("Effect") != "Allow":
        return []
    if "NotAction" in statement:
        excluded = [a.lower() for a in _listed(statement, "NotAction")]
        if any(a in ("*", "s3:*") for a in excluded):
            return []
    elif not any(a == "*" or a.lower().startswith("s3:") for a in _listed(statement, "Action")):
        return []
    if "NotResource" in statement:
        return [("*", f"every resource but {_listed(statement, 'NotResource')!r} (NotResource)")]
    return [(r, repr(r)) for r in _listed(statement, "Resource") if r]


def _engine_roles(resources: Sequence[Res]) -> Iterator[tuple[Res, str | None]]:
    """Every engine role, with the service account assuming it when it lacks the engine workload tag."""
    tagged = _tagged(resources, ROLE, WORKLOAD_TAG, ENGINE_WORKLOAD)
    yield from ((role, None) for role in tagged)
    seen = {role.urn for role in tagged}
    for role, how in _assumed_by_engines(resources):
        if role.urn not in seen:
            seen.add(role.urn)
            yield role, how


def _batch_data(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    """The batch bucket is not the model bucket, and engine roles reach neither it nor all of the model bucket.

    An engine role is one tagged as such, or one the engines' service accounts assume: an untagged one is judged
    all the same, and refused for the missing tag (a preview creating the role knows no ARN to link it by).
    """
    model, batch = (
        {
            str(b.props["bucket"])
            for b in _tagged(resources, (BUCKET, BUCKET_V2), DATA_TAG, data)
            if b.props.get("bucket")
        }
        for data in (MODEL_DATA, BATCH_DATA)
    )
    for b in _tagged(resources, (BUCKET, BUCKET_V2), DATA_TAG, BATCH_DATA):
        if b.props.get("bucket") in model:
            yield Finding(
                f"S3 bucket {b.name}: {b.props.get('bucket')!r} is both the model bucket and the batch bucket; "
                "engines read the model bucket, so tenants' batch files must live in a bucket of their own "
                "(cluster.batch_bucket apart from cluster.model_bucket)",
                b.urn,
            )
    for role, assumed_by in _engine_roles(resources):
        if assumed_by is not None:
            yield Finding(
                f"{role.display}: {assumed_by} assumes it, but it lacks the tag {WORKLOAD_TAG}={ENGINE_WORKLOAD}; "
                "tag it, so the pack knows it for an engine role even before its ARN is known",
                role.urn,
            )
        for holder, where, document in _role_documents(resources, role):
            for statement in _statements(document):
                sid = f" statement {statement.get('Sid')}" if statement.get("Sid") else ""
                for pattern, shown in _s3_resources(statement):
                    for name in sorted(batch):
                        if _reaches_bucket(pattern, name):
                            yield Finding(
                                f"{holder.display}: {where}{sid} grants the engine role {role.name} {shown}, "
                                f"which reaches the batch bucket {name} (tenants' batch files); engines read the "
                                "model store's prefixes only",
                                holder.urn,
                            )
                    for name in sorted(model):
                        if _covers(pattern, f"arn:aws:s3:::{name}/{_OUTSIDE_ANY_PREFIX}"):
                            yield Finding(
                                f"{holder.display}: {where}{sid} grants the engine role {role.name} {shown}, "
                                f"every object of the model bucket {name}; grant the store's prefixes only "
                                f"(arn:aws:s3:::{name}/<prefix>/*)",
                                holder.urn,
                            )


BATCH_DATA_APART = Rule(
    name="batch-data-apart-from-engines",
    category=Category.SECURITY,
    severity=Severity.CRITICAL,
    description="Tenants' batch files are in a bucket of their own (never the model bucket), and no policy "
    "of an engine role (tagged as one, or assumed by the engines' service accounts: then it must carry the tag) "
    "reaches that bucket or every object of the model bucket: inline, RolePolicy or attached, AWS managed S3 "
    "read/full access, NotAction/NotResource grants included. Engines read the model store's prefixes only.",
    remediation="Keep cluster.batch_bucket apart from cluster.model_bucket, tag engine roles "
    f"{WORKLOAD_TAG}={ENGINE_WORKLOAD}, and grant them s3:GetObject on arn:aws:s3:::<model bucket>/<store "
    "prefix>/* only (no AWS managed S3 policies, no NotAction/NotResource).",
    stack_check=_batch_data,
)

EKS_CLUSTER = "aws:eks/cluster:Cluster"


def _eks_encryption(res: Res, config: Config) -> Iterator[str]:
    if res.type != EKS_CLUSTER:
        return
    encryption = as_map(res.props.get("encryptionConfig"))
    if "secrets" not in as_list(encryption.get("resources")) or not as_map(encryption.get("provider")):
        yield (
            f"EKS cluster {res.name}: Kubernetes Secrets (API keys, HF token) are not envelope-encrypted; set "
            "encryptionConfig {resources: [secrets], provider: {keyArn: <KMS key>}}"
        )


EKS_ENCRYPTION = Rule(
    name="eks-secrets-encryption",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="EKS clusters envelope-encrypt Kubernetes Secrets with a KMS key.",
    remediation="Set encryptionConfig with resources [secrets] and a KMS key ARN.",
    resource_check=_eks_encryption,
)


def _open_ranges(cidrs: Sequence[str]) -> list[str]:
    """The ranges that admit every address (a /0), e.g. 0.0.0.0/0."""
    return [c for c in cidrs if c.strip().endswith("/0")]


def _eks_endpoint(res: Res, config: Config) -> Iterator[str]:
    if res.type != EKS_CLUSTER or environment_of(res) not in set(config["environments"]):
        return
    vpc = as_map(res.props.get("vpcConfig"))
    where = f"EKS cluster {res.name} ({environment_of(res)})"
    if vpc.get("endpointPublicAccess") is False:
        if vpc.get("endpointPrivateAccess") is not True:
            yield f"{where}: neither endpoint is enabled; set endpointPrivateAccess: true"
        return
    cidrs = [str(c) for c in as_list(vpc.get("publicAccessCidrs"))]
    fix = (
        "list only the addresses `pulumi up` and kubectl come from in cluster.api_endpoint.public_cidrs (your CI "
        "runners' egress), or use access: private with a runner inside the VPC"
    )
    if not cidrs:
        yield f"{where}: the Kubernetes API endpoint is public to the whole internet (no allow-list); {fix}"
    elif open_ranges := _open_ranges(cidrs):
        yield (
            f"{where}: the public Kubernetes API endpoint admits {', '.join(open_ranges)}, the whole internet; {fix}"
        )


EKS_ENDPOINT = Rule(
    name="eks-api-endpoint-restricted",
    category=Category.SECURITY,
    severity=Severity.HIGH,
    description="In the listed environments (prod by default) the EKS API endpoint is private, or public only to "
    "an allow-list of address ranges that does not include 0.0.0.0/0.",
    remediation="Set cluster.api_endpoint to access: private (with a runner in the VPC), or access: public with "
    "public_cidrs limited to the deployers' addresses.",
    resource_check=_eks_endpoint,
    settings=(Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments the rule applies to."),),
)


TELEMETRY_OFF = dict(TELEMETRY_OFF_ENV)  # what the engines are rendered with (runtime.engines)


def _telemetry(res: Res, config: Config) -> Iterator[str]:
    required = dict(config["required_env"])
    for e in engines([res]):
        env = {
            str(as_map(v).get("name")): as_map(v).get("value") for v in as_list(e.container.props.get("env"))
        }
        wrong = [f"{k}={v}" for k, v in required.items() if str(env.get(k)) != str(v)]
        if wrong:
            yield (
                f"{res.display}: engine container does not opt out of usage statistics and telemetry (needs "
                f"{', '.join(wrong)}); vLLM reports usage to its authors' server unless told not to. Set these "
                "environment variables on the engine"
            )


TELEMETRY = Rule(
    name="engine-telemetry-off",
    category=Category.SECURITY,
    severity=Severity.MEDIUM,
    description=f"Engine containers opt out of usage statistics and telemetry ({', '.join(TELEMETRY_OFF)}), "
    "so serving pods never phone home.",
    remediation=f"Set {', '.join(f'{k}={v}' for k, v in TELEMETRY_OFF.items())} on engine containers.",
    resource_check=_telemetry,
    settings=(
        Setting(
            "required_env",
            {"type": "object", "additionalProperties": {"type": "string"}},
            TELEMETRY_OFF,
            "Environment variables (name -> value) every engine container must set.",
        ),
    ),
)

RULES = (
    IMAGES_PINNED,
    CHARTS_PINNED,
    NO_ROOT,
    PLAINTEXT,
    NETWORK,
    PUBLIC_AUTH,
    S3,
    IAM,
    BATCH_DATA_APART,
    EKS_ENCRYPTION,
    EKS_ENDPOINT,
    TELEMETRY,
)
