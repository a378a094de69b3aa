/// \file ubep.hpp
/// Umbrella header: the whole public API of ubep.
#pragma once

#include "ubep/config.hpp"
#include "ubep/context.hpp"
#include "ubep/error.hpp"
#include "ubep/gpu.hpp"
#include "ubep/moe.hpp"
#include "ubep/options.hpp"
#include "ubep/signal.hpp"
#include "ubep/stream.hpp"
#include "ubep/symmetric.hpp"
#include "ubep/topology.hpp"
