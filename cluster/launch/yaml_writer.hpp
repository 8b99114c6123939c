// A small block-style YAML writer for JSON values: how troupe emits Kubernetes manifests.
//
// Manifests are read by people (reviewed in a pull request, diffed between releases) as much
// as by kubectl, so they should look like the YAML an operator writes by hand, not like JSON.
// Debian has no YAML emitter among troupe's dependencies, and the subset manifests need is
// small: maps in insertion order, sequences, strings, integers, booleans. This writer turns a
// nlohmann::ordered_json into that YAML, deterministically (same value, same bytes). Strings
// are written plain only when YAML 1.1 and 1.2 both read them back as the same string (so
// "true", "0755", "1.0", "on" or "a: b" are quoted); a multi-line string that ends with a
// newline (a file) is a literal block that keeps its bytes exactly; anything else is a JSON
// double-quoted string, which is valid YAML.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace troupe::cluster {

/// The YAML text of `value` (a map, normally), ending with a newline, without a document
/// marker. Floats are written in JSON notation; null as `null`. Never throws for a value that
/// nlohmann can dump.
std::string to_yaml(const nlohmann::ordered_json& value);

} // namespace troupe::cluster
