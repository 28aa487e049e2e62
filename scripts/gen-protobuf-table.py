#!/usr/bin/env python3
"""Extracts the protobuf message table of the Kubernetes kinds Orrery serves from the k8s-pb
crate (kube-rs's prost bindings of the upstream .proto files), for the protobuf request
decoder in crates/apiserver/src/protobuf.rs.

    python3 scripts/gen-protobuf-table.py ~/.cargo/registry/src/*/k8s-pb-0.9.0/src \
        > crates/apiserver/src/protobuf/k8s-messages.txt

Output, one message per block:

    M <message name, as the OpenAPI component is named>
    F <tag> <field name (snake case)> <kind> [<message name>]

kind: string, bool, int32, int64, double, bytes, message, map:string, map:bytes,
map:message; a leading '*' marks a repeated field. JSON names are resolved at run time
against the served OpenAPI schemas.
"""
import os
import re
import sys

MODULES = {
    "api/core/v1": "io.k8s.api.core.v1",
    "api/apps/v1": "io.k8s.api.apps.v1",
    "api/batch/v1": "io.k8s.api.batch.v1",
    "api/networking/v1": "io.k8s.api.networking.v1",
    "api/discovery/v1": "io.k8s.api.discovery.v1",
    "api/autoscaling/v1": "io.k8s.api.autoscaling.v1",
    "api/authentication/v1": "io.k8s.api.authentication.v1",
    "api/authorization/v1": "io.k8s.api.authorization.v1",
    "api/rbac/v1": "io.k8s.api.rbac.v1",
    "apiextensions_apiserver/pkg/apis/apiextensions/v1": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1",
    "apimachinery/pkg/apis/meta/v1": "io.k8s.apimachinery.pkg.apis.meta.v1",
    "apimachinery/pkg/util/intstr": "io.k8s.apimachinery.pkg.util.intstr",
    "apimachinery/pkg/runtime": "io.k8s.apimachinery.pkg.runtime",
    "apimachinery/pkg/api/resource": "io.k8s.apimachinery.pkg.api.resource",
}

ATTR = re.compile(r"#\[prost\(([^)]*)\)\]")
FIELD = re.compile(r"^\s*pub (?:r#)?(\w+):\s*(.*)$")
STRUCT = re.compile(r"^pub struct (\w+) \{")


def resolve(module, rust_type):
    """Message name of a Rust type path written inside `module`."""
    inner = rust_type
    for wrapper in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        inner = inner.replace(wrapper, "")
    inner = inner.rstrip(">, ").strip()
    for map_type in ("::std::collections::BTreeMap<", "::prost::alloc::collections::BTreeMap<"):
        if inner.startswith(map_type):
            inner = inner[len(map_type):].split(",", 1)[1].strip().rstrip(">, ").strip()
    parts = inner.split("::")
    path = module.split("/")
    while parts and parts[0] == "super":
        parts.pop(0)
        path.pop()
    name = parts[-1]
    target = "/".join(path + parts[:-1])
    if target not in MODULES:
        return None
    return MODULES[target] + "." + name


def main(src):
    for module, prefix in MODULES.items():
        text = open(os.path.join(src, module, "mod.rs")).read().splitlines()
        i = 0
        while i < len(text):
            m = STRUCT.match(text[i])
            if not m:
                i += 1
                continue
            print(f"M {prefix}.{m.group(1)}")
            i += 1
            while i < len(text) and not text[i].startswith("}"):
                a = ATTR.search(text[i])
                if not a:
                    i += 1
                    continue
                attr = a.group(1)
                # The field follows the attribute; its type may span lines up to the comma.
                i += 1
                while not FIELD.match(text[i]):
                    i += 1
                fm = FIELD.match(text[i])
                name, ty = fm.group(1), fm.group(2)
                # Up to the comma that ends the field, outside any generic brackets.
                while not (ty.rstrip().endswith(",") and ty.count("<") == ty.count(">")):
                    i += 1
                    ty += text[i].strip()
                tag = re.search(r'tag = "(\d+)"', attr).group(1)
                repeated = "repeated" in attr
                if attr.startswith("btree_map"):
                    value = re.search(r'btree_map = "string, (\w+)"', attr).group(1)
                    kind = "map:" + value
                    target = resolve(module, ty) if value == "message" else None
                else:
                    kind = attr.split(",")[0].strip()
                    if kind.startswith("bytes"):
                        kind = "bytes"
                    target = resolve(module, ty) if kind == "message" else None
                line = f"F {tag} {name} {'*' if repeated else ''}{kind}"
                if target:
                    line += f" {target}"
                elif kind in ("message", "map:message"):
                    line += " ?"
                print(line)
                i += 1
            i += 1


if __name__ == "__main__":
    main(sys.argv[1])
