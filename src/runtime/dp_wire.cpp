#include "runtime/dp_wire.h"

#include <cstring>
#include <type_traits>

#include "core/check.h"

namespace dil::runtime {
namespace {

// "DPW" + version << 4 | kind, version 2 (cached tokens, prefix-cache counters); a report and a
// command list differ in their last byte so that a message read in the wrong place fails loudly.
constexpr uint32_t kCommandsMagic = 0x44505721;
constexpr uint32_t kReportMagic = 0x44505722;

class Writer {
 public:
  template <typename T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof v);
  }
  void str(const std::string& s) {
    pod(uint64_t(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void ids(const std::vector<int32_t>& v) {
    pod(uint64_t(v.size()));
    for (int32_t x : v) pod(x);
  }
  std::vector<char> take() { return std::move(buf_); }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  template <typename T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + off_, sizeof v);
    off_ += sizeof v;
    return v;
  }
  // A count of elements of at least `min_bytes` each: bounded by what is left of the message.
  size_t count(size_t min_bytes) {
    const uint64_t n = pod<uint64_t>();
    if (min_bytes > 0 && n > (b_.size() - off_) / min_bytes) DIL_FAIL("dp wire: count ", n, " exceeds the message");
    return size_t(n);
  }
  std::string str() {
    const size_t n = count(1);
    std::string s(b_.data() + off_, n);
    off_ += n;
    return s;
  }
  std::vector<int32_t> ids() {
    std::vector<int32_t> v(count(4));
    for (int32_t& x : v) x = pod<int32_t>();
    return v;
  }
  bool boolean() {
    const uint8_t v = pod<uint8_t>();
    if (v > 1) DIL_FAIL("dp wire: bad bool ", int(v));
    return v == 1;
  }
  void done() const {
    if (off_ != b_.size()) DIL_FAIL("dp wire: ", b_.size() - off_, " trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (b_.size() - off_ < n) DIL_FAIL("dp wire: message truncated at byte ", off_, " of ", b_.size());
  }
  const std::vector<char>& b_;
  size_t off_ = 0;
};

void put_request(Writer& w, const GenRequest& r) {
  w.str(r.id);
  w.ids(r.prompt);
  const SamplingParams& s = r.sampling;
  w.pod(s.temperature);
  w.pod(int32_t(s.top_k));
  w.pod(s.top_p);
  w.pod(s.min_p);
  w.pod(s.presence_penalty);
  w.pod(s.frequency_penalty);
  w.pod(s.repetition_penalty);
  w.pod(uint64_t(s.logit_bias.size()));
  for (auto [t, b] : s.logit_bias) {
    w.pod(t);
    w.pod(b);
  }
  w.pod(uint8_t(s.seed.has_value()));
  w.pod(s.seed.value_or(0));
  w.pod(int32_t(s.logprobs));
  w.ids(s.allowed_token_ids);
  w.pod(int32_t(r.stop.max_tokens));
  w.pod(int32_t(r.stop.min_tokens));
  w.pod(uint8_t(r.stop.ignore_eos));
  w.ids(r.stop.stop_token_ids);
  w.pod(int32_t(r.dp_rank));
}

GenRequest get_request(Reader& rd) {
  GenRequest r;
  r.id = rd.str();
  r.prompt = rd.ids();
  SamplingParams& s = r.sampling;
  s.temperature = rd.pod<float>();
  s.top_k = rd.pod<int32_t>();
  s.top_p = rd.pod<float>();
  s.min_p = rd.pod<float>();
  s.presence_penalty = rd.pod<float>();
  s.frequency_penalty = rd.pod<float>();
  s.repetition_penalty = rd.pod<float>();
  for (size_t i = 0, n = rd.count(8); i < n; ++i) {
    const int32_t t = rd.pod<int32_t>();
    s.logit_bias[t] = rd.pod<float>();
  }
  const bool has_seed = rd.boolean();
  const uint64_t seed = rd.pod<uint64_t>();
  if (has_seed) s.seed = seed;
  s.logprobs = rd.pod<int32_t>();
  s.allowed_token_ids = rd.ids();
  r.stop.max_tokens = rd.pod<int32_t>();
  r.stop.min_tokens = rd.pod<int32_t>();
  r.stop.ignore_eos = rd.boolean();
  r.stop.stop_token_ids = rd.ids();
  r.dp_rank = rd.pod<int32_t>();
  return r;
}

void put_output(Writer& w, const GenOutput& o) {
  w.pod(uint64_t(o.tokens.size()));
  for (const GenToken& t : o.tokens) {
    w.pod(t.token);
    w.pod(t.logprob);
    w.pod(uint64_t(t.top.size()));
    for (const TokenLogprob& p : t.top) {
      w.pod(p.token);
      w.pod(p.logprob);
    }
  }
  w.pod(uint8_t(o.finish));
  w.pod(o.stop_token);
  w.str(o.error);
  w.pod(int32_t(o.prompt_tokens));
  w.pod(int32_t(o.completion_tokens));
  w.pod(int32_t(o.cached_tokens));
}

GenOutput get_output(Reader& rd) {
  GenOutput o;
  o.tokens.resize(rd.count(16));
  for (GenToken& t : o.tokens) {
    t.token = rd.pod<int32_t>();
    t.logprob = rd.pod<float>();
    t.top.resize(rd.count(8));
    for (TokenLogprob& p : t.top) {
      p.token = rd.pod<int32_t>();
      p.logprob = rd.pod<float>();
    }
  }
  const uint8_t f = rd.pod<uint8_t>();
  if (f > uint8_t(FinishReason::Error)) DIL_FAIL("dp wire: bad finish reason ", int(f));
  o.finish = FinishReason(f);
  o.stop_token = rd.pod<int32_t>();
  o.error = rd.str();
  o.prompt_tokens = rd.pod<int32_t>();
  o.completion_tokens = rd.pod<int32_t>();
  o.cached_tokens = rd.pod<int32_t>();
  return o;
}

void put_stats(Writer& w, const EngineStats& s) {
  w.pod(int32_t(s.running));
  w.pod(int32_t(s.waiting));
  w.pod(int32_t(s.swapped));
  for (int64_t v : {s.preemptions, s.prompt_tokens_total, s.generation_tokens_total, s.steps, s.kv_blocks_total,
                    s.kv_blocks_used, s.kv_slots_total, s.kv_slots_used, s.kv_bytes_total, s.kv_bytes_used,
                    s.prefix_cache_queries, s.prefix_cache_hits, s.prompt_tokens_computed, s.prompt_tokens_cached,
                    s.forks, s.prefix_cache_blocks, s.prefix_cache_snapshots, s.prefix_cache_evictions})
    w.pod(v);
  w.pod(s.kv_usage);
  w.pod(s.mask_seconds_total);
  w.pod(s.mask_wait_seconds_total);
}

EngineStats get_stats(Reader& rd) {
  EngineStats s;
  s.running = rd.pod<int32_t>();
  s.waiting = rd.pod<int32_t>();
  s.swapped = rd.pod<int32_t>();
  for (int64_t* v : {&s.preemptions, &s.prompt_tokens_total, &s.generation_tokens_total, &s.steps, &s.kv_blocks_total,
                     &s.kv_blocks_used, &s.kv_slots_total, &s.kv_slots_used, &s.kv_bytes_total, &s.kv_bytes_used,
                     &s.prefix_cache_queries, &s.prefix_cache_hits, &s.prompt_tokens_computed, &s.prompt_tokens_cached,
                     &s.forks, &s.prefix_cache_blocks, &s.prefix_cache_snapshots, &s.prefix_cache_evictions})
    *v = rd.pod<int64_t>();
  s.kv_usage = rd.pod<double>();
  s.mask_seconds_total = rd.pod<double>();
  s.mask_wait_seconds_total = rd.pod<double>();
  return s;
}

void check_magic(Reader& rd, uint32_t want, const char* what) {
  const uint32_t m = rd.pod<uint32_t>();
  if (m != want) DIL_FAIL("dp wire: not a ", what, " message (magic ", m, "); ranks of different builds?");
}

}  // namespace

std::vector<char> encode_commands(const DpCommands& c) {
  Writer w;
  w.pod(kCommandsMagic);
  w.pod(uint8_t(c.shutdown));
  w.pod(uint64_t(c.cmds.size()));
  for (const DpCommand& d : c.cmds) {
    w.pod(uint8_t(d.kind));
    if (d.kind == DpCommand::Kind::Submit)
      put_request(w, d.req);
    else
      w.str(d.id);
  }
  return w.take();
}

DpCommands decode_commands(const std::vector<char>& bytes) {
  Reader rd(bytes);
  check_magic(rd, kCommandsMagic, "command");
  DpCommands c;
  c.shutdown = rd.boolean();
  c.cmds.resize(rd.count(9));
  for (DpCommand& d : c.cmds) {
    const uint8_t k = rd.pod<uint8_t>();
    if (k == uint8_t(DpCommand::Kind::Submit)) {
      d.kind = DpCommand::Kind::Submit;
      d.req = get_request(rd);
    } else if (k == uint8_t(DpCommand::Kind::Cancel)) {
      d.kind = DpCommand::Kind::Cancel;
      d.id = rd.str();
    } else {
      DIL_FAIL("dp wire: bad command kind ", int(k));
    }
  }
  rd.done();
  return c;
}

std::vector<char> encode_report(const DpReport& r) {
  Writer w;
  w.pod(kReportMagic);
  w.pod(uint8_t(r.stop_requested));
  w.pod(r.submits_seen);
  put_stats(w, r.stats);
  w.pod(uint64_t(r.outputs.size()));
  for (const DpOutput& o : r.outputs) {
    w.str(o.id);
    put_output(w, o.out);
  }
  return w.take();
}

DpReport decode_report(const std::vector<char>& bytes) {
  Reader rd(bytes);
  check_magic(rd, kReportMagic, "report");
  DpReport r;
  r.stop_requested = rd.boolean();
  r.submits_seen = rd.pod<int64_t>();
  r.stats = get_stats(rd);
  r.outputs.resize(rd.count(8));
  for (DpOutput& o : r.outputs) {
    o.id = rd.str();
    o.out = get_output(rd);
  }
  rd.done();
  return r;
}

}  // namespace dil::runtime
