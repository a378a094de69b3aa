// The MoE element types and modes: names and parsing of DType, Combine and Memory, element conversions
// (bf16, e4m3), and the expert map (which rank owns which experts), shared by both layers.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "moe/kernels.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {

const char* to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "e4m3" || name == "fp8") return DType::e4m3;
  throw Error(Errc::invalid_argument, "ubep: moe: unknown element type '" + name + "' (f32, bf16, e4m3)");
}

const char* to_string(Combine c) noexcept {
  switch (c) {
    case Combine::per_expert: return "per_expert";
    case Combine::per_rank: return "per_rank";
    case Combine::per_node: return "per_node";
    case Combine::automatic: return "automatic";
  }
  return "?";
}

Combine parse_combine(const std::string& name) {
  if (name == "per_expert") return Combine::per_expert;
  if (name == "per_rank") return Combine::per_rank;
  if (name == "per_node") return Combine::per_node;
  if (name == "automatic" || name == "auto") return Combine::automatic;
  throw Error(Errc::invalid_argument,
              "ubep: moe: unknown combine mode '" + name + "' (per_expert, per_rank, per_node, automatic)");
}

Combine resolve_combine(Combine c, const Topology& topology) {
  if (c != Combine::automatic) return c;
  return topology.num_nodes() > 1 ? Combine::per_node : Combine::per_expert;
}

const char* to_string(Memory m) noexcept {
  switch (m) {
    case Memory::host: return "host";
    case Memory::device: return "device";
  }
  return "?";
}

Memory parse_memory(const std::string& name) {
  if (name == "host") return Memory::host;
  if (name == "device") return Memory::device;
  throw Error(Errc::invalid_argument, "ubep: moe: unknown memory '" + name + "' (host, device)");
}

std::size_t element_size(DType t) noexcept { return t == DType::f32 ? 4 : t == DType::bf16 ? 2 : 1; }
DType output_dtype(DType t) noexcept { return t == DType::f32 ? DType::f32 : DType::bf16; }

std::uint16_t float_to_bf16(float f) noexcept { return float_to_bf16_bits(f); }

float bf16_to_float(std::uint16_t b) noexcept { return bf16_bits_to_float(b); }

float e4m3_to_float(std::uint8_t q) noexcept {
  const int sign = q >> 7, exp = (q >> 3) & 0xf, man = q & 7;
  float v;
  if (exp == 0xf && man == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man) / 8.0f, -6);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  }
  return sign ? -v : v;
}

std::uint8_t float_to_e4m3(float f) noexcept {
  if (std::isnan(f)) return 0x7f;
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate at the largest finite value
  // Nearest representable value, ties to even mantissa: scan the 127 magnitudes by binary search.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (e4m3_to_float(static_cast<std::uint8_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo < 0x7e) {
    const float below = e4m3_to_float(static_cast<std::uint8_t>(lo));
    const float above = e4m3_to_float(static_cast<std::uint8_t>(lo + 1));
    if (a - below > above - a || (a - below == above - a && (lo & 1))) ++lo;
  }
  return sign | static_cast<std::uint8_t>(lo);
}

float load_element(DType t, const std::byte* row, int i, float scale) noexcept {
  switch (t) {
    case DType::f32: {
      float v;
      std::memcpy(&v, row + 4 * static_cast<std::size_t>(i), 4);
      return v;
    }
    case DType::bf16: {
      std::uint16_t b;
      std::memcpy(&b, row + 2 * static_cast<std::size_t>(i), 2);
      return bf16_to_float(b);
    }
    case DType::e4m3: return e4m3_to_float(static_cast<std::uint8_t>(row[i])) * scale;
  }
  return 0;
}

void store_element(DType t, std::byte* row, int i, float v, float scale) noexcept {
  switch (t) {
    case DType::f32: std::memcpy(row + 4 * static_cast<std::size_t>(i), &v, 4); break;
    case DType::bf16: {
      const std::uint16_t b = float_to_bf16(v);
      std::memcpy(row + 2 * static_cast<std::size_t>(i), &b, 2);
      break;
    }
    case DType::e4m3: row[i] = static_cast<std::byte>(float_to_e4m3(v / scale)); break;
  }
}

int ExpertMap::first(int rank) const {
  const int base = num_experts / ranks, extra = num_experts % ranks;
  return rank * base + std::min(rank, extra);
}
int ExpertMap::count(int rank) const {
  const int base = num_experts / ranks, extra = num_experts % ranks;
  return base + (rank < extra ? 1 : 0);
}
int ExpertMap::owner(int expert) const {
  const int base = num_experts / ranks, extra = num_experts % ranks;
  const int big = extra * (base + 1);
  return expert < big ? expert / (base + 1) : extra + (expert - big) / std::max(base, 1);
}

}  // namespace ubep::moe
