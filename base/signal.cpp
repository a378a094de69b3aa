// The names of the signal vocabulary (include/ubep/signal.hpp). signal.hpp is the base layer's: the runtime's
// waits and the GPU kernels of transports/cuda/ share SignalOp, Cmp and compare().
#include "ubep/signal.hpp"

namespace ubep {

const char* to_string(SignalOp op) noexcept { return op == SignalOp::set ? "set" : "add"; }

const char* to_string(Cmp cmp) noexcept {
  switch (cmp) {
    case Cmp::eq: return "==";
    case Cmp::ne: return "!=";
    case Cmp::gt: return ">";
    case Cmp::ge: return ">=";
    case Cmp::lt: return "<";
    case Cmp::le: return "<=";
  }
  return "?";
}

}  // namespace ubep
