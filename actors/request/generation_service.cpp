#include "actors/request/generation_service.hpp"

#include "actors/kv/block_key.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <string>

namespace troupe::actors {

namespace {

struct service_state {
  generation_service_params params;
  static inline const char* name = "generation_service";
};

generation_service::behavior_type
service_fn(generation_service::stateful_pointer<service_state> self,
           generation_service_params params) {
  self->state.params = std::move(params);
  return {
    [self](generation_request& g) -> caf::result<caf::actor> {
      auto& st = self->state;
      auto refuse = [](std::string why) {
        return caf::make_error(caf::sec::invalid_argument, std::move(why));
      };
      if (g.prompt.empty())
        return refuse("generation_request: empty prompt");
      if (g.max_tokens == 0)
        return refuse("generation_request: max_tokens must be positive");
      if (!g.sink)
        return refuse("generation_request: no sink");
      if (g.prompt.size() > st.params.max_context)
        return refuse("generation_request: the prompt has " + std::to_string(g.prompt.size())
                      + " tokens; the limit is " + std::to_string(st.params.max_context));
      request_spec spec;
      spec.id = g.id;
      spec.input_tokens = g.prompt.size();
      spec.output_tokens = g.max_tokens;
      std::vector<std::uint32_t> ids(g.prompt.begin(), g.prompt.end());
      spec.chain = make_chain(std::span<const std::uint32_t>(ids),
                              st.params.services.chain_root);
      spec.traffic = g.traffic;
      spec.prompt = std::move(g.prompt);
      spec.sampling = g.sampling;
      spec.stop_ids = std::move(g.stop_ids);
      spec.stream = std::move(g.sink);
      spec.constraint = std::move(g.constraint);
      return spawn_request(self, std::move(spec), st.params.services);
    },
  };
}

} // namespace

generation_service spawn_generation_service(caf::actor_system& sys,
                                            generation_service_params params) {
  return sys.spawn(service_fn, std::move(params));
}

} // namespace troupe::actors
