// The messages of the data-parallel engine's per-step host round (dp_engine.h), and their
// byte encoding. Rank 0 sends every rank a DpCommands (new requests, cancels, shutdown); every
// rank answers with a DpReport (outputs since the last round, its stats). The ranks of one job
// run the same binary, so the encoding is the host's (little-endian, fixed-width integers,
// IEEE floats) behind a magic and version word; decoding checks every length against the
// message and throws dil::Error on a short or malformed one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dil/engine.h"

namespace dil::runtime {

struct DpCommand {
  enum class Kind : uint8_t { Submit = 1, Cancel = 2 };
  Kind kind = Kind::Submit;
  GenRequest req;  // Submit
  std::string id;  // Cancel
};

// Rank 0 -> rank r, once per round. Commands apply in order (a cancel may follow its submit).
struct DpCommands {
  bool shutdown = false;  // every rank stops after this round
  std::vector<DpCommand> cmds;
};

struct DpOutput {
  std::string id;
  GenOutput out;  // outputs of one round merged (RequestStream semantics)
};

// Rank r -> rank 0, once per round.
struct DpReport {
  bool stop_requested = false;  // this rank was asked to stop (a signal): rank 0 stops the job
  int64_t submits_seen = 0;     // Submit commands received so far (all reflected in `stats`)
  EngineStats stats;            // this rank's engine after its last step (dp_ranks empty)
  std::vector<DpOutput> outputs;
};

std::vector<char> encode_commands(const DpCommands& c);
DpCommands decode_commands(const std::vector<char>& bytes);
std::vector<char> encode_report(const DpReport& r);
DpReport decode_report(const std::vector<char>& bytes);

}  // namespace dil::runtime
