// ubep-stress: the Runner's checks (stress_runner.hpp): every byte written or read against its keyed
// pattern, every word against its expected value, and, as their owner, the counters against every rank's
// plan and log.
#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include "stress_runner.hpp"

namespace ubep::stress {
namespace {

std::string hex8(const std::byte* p, std::size_t n) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(p[i]));
    s += b;
  }
  return s;
}

}  // namespace

// ---- checks ----
void Runner::check_write(int writer, const POp& op, std::size_t index, std::uint64_t r, const char* when) {
  if (op.len == 0) return;
  const std::byte* got = slot(writer) + op.off;
  const std::uint64_t k = write_key(s_.seed, writer, me_, r);
  counters_.bytes_checked += op.len;
  const std::size_t bad = first_mismatch(k, op.off, got, op.len);
  if (bad == op.len) return;
  std::byte want[8];
  fill_pattern(k, op.off + bad, want, std::min<std::size_t>(8, op.len - bad));
  std::ostringstream m;
  m << to_string(op.kind) << " from rank " << writer << " to rank " << me_ << ", op #" << index << ", slot offset "
    << op.off << ", " << op.len << " bytes, checked " << when << ": first bad byte at +" << bad << ": expected "
    << hex8(want, op.len - bad) << " got " << hex8(got + bad, op.len - bad) << "; "
    << matching_bytes(k, op.off, got, op.len) << "/" << op.len << " bytes match this round";
  if (r > 0)
    m << ", " << matching_bytes(write_key(s_.seed, writer, me_, r - 1), op.off, got, op.len) << " match round " << r - 1
      << " (stale)";
  mism_.report(r, m.str());
}

void Runner::check_get(int owner, std::size_t off, const std::byte* got, std::size_t len, std::uint64_t r, K kind,
                       int index) {
  const std::uint64_t k = get_key(s_.seed, owner, r);
  counters_.bytes_checked += len;
  const std::size_t bad = first_mismatch(k, off, got, len);
  if (bad == len) return;
  std::byte want[8];
  fill_pattern(k, off + bad, want, std::min<std::size_t>(8, len - bad));
  std::ostringstream m;
  m << to_string(kind) << " by rank " << me_ << " from rank " << owner << ", op #" << index << ", offset " << off
    << ", " << len << " bytes: first bad byte at +" << bad << ": expected " << hex8(want, len - bad) << " got "
    << hex8(got + bad, len - bad) << "; " << matching_bytes(k, off, got, len) << "/" << len
    << " bytes match this round";
  if (r > 0) m << ", " << matching_bytes(get_key(s_.seed, owner, r - 1), off, got, len) << " match round " << r - 1;
  mism_.report(r, m.str());
}

void Runner::expect_word(bool ok, std::uint64_t r, const std::string& what) {
  ++counters_.words_checked;
  if (!ok) mism_.report(r, what);
}

void Runner::complete_gets(std::optional<int> pe, std::uint64_t r) {
  auto it = std::remove_if(pending_.begin(), pending_.end(), [&](PendingGet& g) {
    if (pe && g.pe != *pe) return false;
    check_get(g.pe, g.off, g.buf.data(), g.len, r, K::get_nbi, g.index);
    return true;
  });
  pending_.erase(it, pending_.end());
}

// ---- counters, as their owner ----
void Runner::check_counters(std::uint64_t r, const std::vector<Plan>& plans) {
  for (int j = 0; j < PlanSettings::kWords; ++j) {
    // add words: the sum, fetch_add intervals disjoint inside [start, end), fetches inside [start, end]
    {
      const std::uint64_t start = add_expected_[j];
      std::uint64_t sum = 0;
      std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [old, old + amount)
      std::vector<std::uint64_t> reads;
      for (int x = 0; x < P_; ++x) {
        std::uint64_t floor = 0;  // a writer's own fetches never go backwards
        for (const POp& op : plans[x].ops) {
          if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
          if (op.kind == K::add) sum += op.value;
          if (op.kind != K::fetch_add && op.kind != K::fetch_add_word) continue;
          const std::uint64_t got = logs_[static_cast<std::size_t>(x) * logmax_ + op.log].result;
          expect_word(got >= floor, r,
                      "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": rank " +
                          std::to_string(x) + "'s " + to_string(op.kind) + " returned " + std::to_string(got) +
                          ", below its own earlier result " + std::to_string(floor));
          if (op.kind == K::fetch_add) {
            sum += op.value;
            spans.emplace_back(got, got + op.value);
            floor = std::max(floor, got + op.value);
          } else {
            reads.push_back(got);
            floor = std::max(floor, got);
          }
        }
      }
      const std::uint64_t end = start + sum;
      std::uint64_t final_v;
      {
        Timer t(hist_, Op::atomic_fetch);
        final_v = ctx_.atomic_fetch(add_word(j), me_);
      }
      expect_word(final_v == end, r,
                  "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": expected " +
                      std::to_string(end) + " (= " + std::to_string(start) + " + " + std::to_string(sum) +
                      " added this round) got " + std::to_string(final_v));
      std::sort(spans.begin(), spans.end());
      for (std::size_t i = 0; i < spans.size(); ++i) {
        const bool inside = spans[i].first >= start && spans[i].second <= end;
        const bool disjoint = i == 0 || spans[i].first >= spans[i - 1].second;
        expect_word(
            inside && disjoint, r,
            "add word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": fetch_add returned " +
                std::to_string(spans[i].first) + " (+" + std::to_string(spans[i].second - spans[i].first) + ")" +
                (inside ? "" : ", outside this round's [" + std::to_string(start) + ", " + std::to_string(end) + ")") +
                (disjoint ? "" : ", overlapping another fetch_add's range (not atomic)"));
      }
      for (std::uint64_t v : reads)
        expect_word(v >= start && v <= end, r,
                    "add word " + std::to_string(j) + ": fetch returned " + std::to_string(v) + " outside [" +
                        std::to_string(start) + ", " + std::to_string(end) + "]");
      add_expected_[j] = final_v;
    }
    // swap words: {initial token} + tokens swapped in == tokens returned + final value, as multisets
    {
      std::vector<std::uint64_t> in{swap_init(s_.seed, r, me_, j)}, out, reads;
      for (int x = 0; x < P_; ++x) {
        for (const POp& op : plans[x].ops) {
          if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
          const std::uint64_t got = logs_[static_cast<std::size_t>(x) * logmax_ + op.log].result;
          if (op.kind == K::swap) {
            in.push_back(op.value);
            out.push_back(got);
          } else if (op.kind == K::fetch_swap_word) {
            reads.push_back(got);
          }
        }
      }
      std::uint64_t final_v;
      {
        Timer t(hist_, Op::atomic_fetch);
        final_v = ctx_.atomic_fetch(swap_word(j), me_);
      }
      out.push_back(final_v);
      std::sort(in.begin(), in.end());
      std::sort(out.begin(), out.end());
      std::size_t diff = 0;
      {
        std::vector<std::uint64_t> d;
        std::set_symmetric_difference(in.begin(), in.end(), out.begin(), out.end(), std::back_inserter(d));
        diff = d.size();
      }
      expect_word(diff == 0, r,
                  "swap word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": " + std::to_string(diff) +
                      " tokens differ between those swapped in (" + std::to_string(in.size()) +
                      " with the initial one) and those returned plus the final value (lost or duplicated)");
      for (std::uint64_t v : reads)
        expect_word(std::binary_search(in.begin(), in.end(), v), r,
                    "swap word " + std::to_string(j) + ": fetch returned " + std::to_string(v) +
                        ", a value no rank swapped in this round");
      Timer t(hist_, Op::atomic_set);
      ctx_.atomic_set(swap_word(j), swap_init(s_.seed, r + 1, me_, j), me_);
    }
    // CAS words: the successful olds are exactly start, start + 1, ..., final - 1
    {
      const std::uint64_t start = cas_expected_[j];
      std::vector<std::uint64_t> olds, reads;
      for (int x = 0; x < P_; ++x) {
        for (const POp& op : plans[x].ops) {
          if (op.pe != me_ || op.word != static_cast<std::uint32_t>(j)) continue;
          const LogEntry& e = logs_[static_cast<std::size_t>(x) * logmax_ + op.log];
          if (op.kind == K::cas_inc && e.result != kCasGaveUp) olds.push_back(e.result);
          if (op.kind == K::cas_fail) {
            expect_word(e.result != op.value, r, "compare_swap with an impossible expected value returned it");
            reads.push_back(e.result);
          }
          if (op.kind == K::fetch_cas_word) reads.push_back(e.result);
        }
      }
      std::uint64_t final_v;
      {
        Timer t(hist_, Op::atomic_fetch);
        final_v = ctx_.atomic_fetch(cas_word(j), me_);
      }
      std::sort(olds.begin(), olds.end());
      bool ok = final_v == start + olds.size();
      for (std::size_t i = 0; ok && i < olds.size(); ++i) ok = olds[i] == start + i;
      expect_word(
          ok, r,
          "cas word " + std::to_string(j) + " on rank " + std::to_string(me_) + ": start " + std::to_string(start) +
              ", " + std::to_string(olds.size()) + " successful increments, final " + std::to_string(final_v) +
              (olds.empty() ? ""
                            : ", olds from " + std::to_string(olds.front()) + " to " + std::to_string(olds.back())));
      for (std::uint64_t v : reads)
        expect_word(v >= start && v <= final_v, r,
                    "cas word " + std::to_string(j) + ": a fetch or failed compare_swap returned " + std::to_string(v) +
                        " outside [" + std::to_string(start) + ", " + std::to_string(final_v) + "]");
      cas_expected_[j] = final_v;
    }
  }
}

}  // namespace ubep::stress
