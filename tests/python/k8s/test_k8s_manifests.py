"""`troupe k8s` manifests against the Kubernetes schemas, offline.

For every example topology (and a few option sets), the objects `troupe k8s` writes are
parsed back with PyYAML and validated with kubernetes-validate in strict mode (unknown fields
are errors) against two Kubernetes versions whose schemas the pinned package bundles. The
ConfigMap must hold the topology file byte for byte, the YAML stream on stdout must equal the
per-object files, and two runs must give the same bytes. A manifest broken on purpose must be
rejected, so a validator that accepts anything fails this test.

Environment: TROUPE (the troupe CLI), TROUPE_SOURCE_DIR (the checkout).
"""
import copy
import os
import pathlib
import subprocess
import tomllib

import kubernetes_validate
import pytest
import yaml

TROUPE = os.environ["TROUPE"]
SOURCE = pathlib.Path(os.environ["TROUPE_SOURCE_DIR"])
TOPOLOGIES = sorted((SOURCE / "examples" / "topologies").glob("*.toml"))
# The oldest and the newest Kubernetes whose schemas kubernetes-validate 1.34.1 bundles and
# that every object here must satisfy.
VERSIONS = ["1.30.0", "1.34.0"]
OPTION_SETS = {
    "defaults": [],
    "volumes": ["--namespace", "serving", "--model-pvc", "deepseek-weights",
                "--store-pvc", "troupe-kv", "--image", "registry.example/troupe:1.2.3"],
    "host-model": ["--model-host-path", "/mnt/models/v4.1-flash", "--gpus-per-node", "4"],
    "tls": ["--tls-secret", "troupe-tls", "--store-pvc", "troupe-kv", "--network-policy"],
}


def emit(topology, options, out_dir=None):
    args = [TROUPE, "k8s", str(topology), *options]
    if out_dir is not None:
        args += ["--out", str(out_dir)]
    done = subprocess.run(args, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def validate(doc):
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("options", sorted(OPTION_SETS), ids=str)
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_manifest_is_valid_kubernetes(topology, options, tmp_path):
    opts = OPTION_SETS[options]
    files = sorted(tmp_path.glob("*.yaml"))
    assert not files
    emit(topology, opts, tmp_path)
    files = sorted(tmp_path.glob("*.yaml"))
    assert len(files) >= 6, files
    docs = [yaml.safe_load(f.read_text()) for f in files]
    for f, doc in zip(files, docs):
        validate(doc)
        assert f.name.endswith(f"-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml")
    kinds = [d["kind"] for d in docs]
    # The control's Deployment, and the block store's when the cluster has one (a store claim,
    # or a topology whose store is a directory).
    spec = tomllib.loads(topology.read_text())
    store = "--store-pvc" in opts or spec.get("storage", {}).get("backend") == "posix"
    assert kinds.count("ConfigMap") == 1 and kinds.count("Deployment") == 1 + store
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert [d["spec"]["template"]["spec"]["containers"][0]["command"][4]
            for d in deployments] == ["control"] + ["store"] * store
    assert ("--external-store" in deployments[0]["spec"]["template"]["spec"]["containers"][0][
        "command"]) == store
    assert kinds.count("StatefulSet") == kinds.count("Service") - 2

    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["topology.toml"] == topology.read_text(), "ConfigMap != the file"

    stream = emit(topology, opts)
    assert stream == b"---\n".join(f.read_bytes() for f in files)
    assert list(yaml.safe_load_all(stream)) == docs
    assert emit(topology, opts) == stream, "two runs gave different bytes"


def test_a_sharded_store_is_one_valid_deployment_per_shard(tmp_path):
    # [storage] shards = 3: three store Deployments, each selecting its own shard's pod and
    # telling it its shard.
    source = SOURCE / "examples" / "topologies" / "local-cpu-3.toml"
    topology = tmp_path / "sharded.toml"
    text = source.read_text().replace('capacity = "16GiB"', 'capacity = "16GiB"\nshards = 3')
    assert "shards = 3" in text
    topology.write_text(text)
    out = tmp_path / "out"
    emit(topology, ["--store-pvc", "troupe-kv"], out)
    docs = [yaml.safe_load(f.read_text()) for f in sorted(out.glob("*.yaml"))]
    for doc in docs:
        validate(doc)
    stores = [d for d in docs if d["kind"] == "Deployment" and "troupe/shard" in d["metadata"]["labels"]]
    assert sorted(d["metadata"]["name"] for d in stores) == [f"local-cpu-3-store-{k}" for k in range(3)]
    for d in stores:
        k = d["metadata"]["labels"]["troupe/shard"]
        assert d["spec"]["selector"]["matchLabels"]["troupe/shard"] == k
        command = d["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[command.index("--index") + 1] == k


def test_the_validator_rejects_broken_manifests(tmp_path):
    emit(TOPOLOGIES[0], [], tmp_path)
    docs = [yaml.safe_load(f.read_text()) for f in sorted(tmp_path.glob("*.yaml"))]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    validate(sts)

    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "two"
    misspelled = copy.deepcopy(sts)
    misspelled["spec"]["template"]["spec"]["containerz"] = \
        misspelled["spec"]["template"]["spec"].pop("containers")
    no_selector = copy.deepcopy(sts)
    del no_selector["spec"]["selector"]
    bad_probe = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    bad_probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = 5
    for broken in (wrong_type, misspelled, no_selector, bad_probe):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)
