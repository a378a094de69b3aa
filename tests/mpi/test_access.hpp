// ubep's own tests only: the internals behind a Context, to play a corrupt or forged peer (wire messages that the
// public API can never send). Not installed; applications have no such door.
#pragma once

#include "runtime/state.hpp"
#include "ubep/config.hpp"
#include "ubep/context.hpp"
#if UBEP_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif

namespace ubep::detail {

struct TestAccess {
  static State& state(Context& ctx) { return *ctx.state_; }
#if UBEP_HAVE_UCX
  /// The ucx transport of ctx, or null when UCX is not in use.
  static UcxTransport* ucx(Context& ctx) { return static_cast<UcxTransport*>(ctx.state_->routes.ucx.get()); }
#endif
};

}  // namespace ubep::detail
