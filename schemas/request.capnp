# The request envelope: what an entrypoint hands to the rest of the cluster for one API request,
# once the recipe has turned the API body into prompt tokens.
#
# Evolution: never renumber or retype a field, never reuse a number; only append fields (next
# free ordinal) and enumerants. Readers treat an absent field as its default.
@0x9b8f63f6f2aa5a33;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas::wire");

# Which public API the request arrived on; decides how the reply is streamed back.
enum ApiProtocol {
  chatCompletions @0;   # OpenAI /v1/chat/completions
  responses @1;         # OpenAI /v1/responses
  messages @2;          # Anthropic /v1/messages
}

# The kind of traffic a request belongs to; decides KV retention (TTL) and scheduling.
enum TrafficClass {
  chatbot @0;           # interactive chat; KV kept 7 days
  agent @1;             # agentic loops with long shared prefixes; KV kept 3 days
  batch @2;             # offline work without a latency target
}

# An image the prompt refers to; the bytes travel separately (vision pool), only this reference
# crosses the boundary with the request.
struct ImageRef {
  id @0 :Text;          # the entrypoint's id for the image, unique within the request
  byteSize @1 :UInt64;  # size of the encoded image in bytes
  contentHash @2 :UInt64;  # xxhash64 of the encoded image bytes (dedup and cache key)
}

# How to sample the completion.
struct SamplingParams {
  maxTokens @0 :UInt32;       # most tokens to generate per choice; 0 means the model's limit
  temperature @1 :Float32 = 1.0;  # softmax temperature; 0 means greedy
  topP @2 :Float32 = 1.0;     # nucleus mass in (0, 1]
  seed :union {               # sampling seed
    random @3 :Void;          # no seed given: the engine draws one
    fixed @4 :UInt64;         # the client's seed, for reproducible sampling
  }
  n @5 :UInt32 = 1;           # number of choices to generate (at least 1)
  stopTokenIds @6 :List(UInt32);  # generation of a choice ends after any of these tokens
}

# One request as it crosses a process boundary.
struct RequestEnvelope {
  requestId @0 :UInt64;       # cluster-unique request id, assigned by the entrypoint
  api @1 :ApiProtocol;        # the API the request arrived on
  trafficClass @2 :TrafficClass;  # traffic class, for KV TTL and scheduling
  model @3 :Text;             # the served model name the client asked for (not empty)
  promptTokens @4 :List(UInt32);  # the prompt after the recipe: token ids, in order
  images @5 :List(ImageRef);  # images the prompt refers to, in prompt order
  sampling @6 :SamplingParams;  # sampling parameters
  deadlineNs @7 :UInt64;      # absolute deadline, ns since the Unix epoch; 0 means none
  arrivalNs @8 :UInt64;       # when the entrypoint admitted the request, ns since the epoch
  priority @9 :Int32;         # scheduling priority; higher runs first, 0 is normal
  stream @10 :Bool;           # true: stream tokens as they come; false: one reply at the end
}
