// A program outside the ubep tree: one put_signal around a ring, checked.
#include <cstdio>
#include <ubep/ubep.hpp>

int main() {
  ubep::Options o = ubep::Options::from_env();
  o.heap_size = 1 << 20;
  ubep::Context ctx(MPI_COMM_WORLD, o);
  auto data = ctx.alloc<int>(1);
  auto sig = ctx.alloc_signals(1);
  const int right = (ctx.rank() + 1) % ctx.size(), left = (ctx.rank() + ctx.size() - 1) % ctx.size();
  const int value = 100 + ctx.rank();
  ctx.put_signal(data.data(), &value, sizeof value, sig.data(), 1, ubep::SignalOp::set, right);
  ctx.wait_until(sig.data(), ubep::Cmp::eq, 1);
  const bool ok = data[0] == 100 + left;
  const int size = ctx.size(), rank = ctx.rank();
  sig.free();
  data.free();
  ctx.finalize();
  if (rank == 0) std::printf("consumer %s: %d ranks\n", ok ? "ok" : "FAILED", size);
  return ok ? 0 : 1;
}
