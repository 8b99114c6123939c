#pragma once
// A request validation error: HTTP status, message and the offending parameter, rendered in the
// error shape of the protocol that received the request.

#include <optional>
#include <string>

namespace troupe::recipe {

struct api_error {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;  // the offending field's path; null in OpenAI's JSON when unset
  std::optional<std::string> code;
  // OpenAI (Chat Completions, Responses):
  // {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
  std::string to_json() const;
  // Anthropic (Messages): {"type": "error", "error": {"type": ..., "message": ...}}
  std::string to_anthropic_json() const;
};

}  // namespace troupe::recipe
