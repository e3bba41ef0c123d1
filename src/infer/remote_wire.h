// The remote engine's wire format (remote_engine.h describes the protocol): the message tags, and
// JSON of the engine API's values (requests, events, options, stats) both ways, shared by the client
// (remote_engine.cpp) and the host (remote_engine_host.cpp). Internal to src/infer. Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "infer/engine.h"

namespace kiln::remote_wire {

using json = nlohmann::json;

constexpr int32_t kTagCommand = 10;  // client -> host: JSON commands
constexpr int32_t kTagWeights = 11;  // client -> host: one tensor's bytes
constexpr int32_t kTagReply = 20;    // host -> client: answers to commands that wait for one
constexpr int32_t kTagEvent = 21;    // host -> client: request events, then "closed"
constexpr double kNcclTimeoutSeconds = 600;  // the most one transfer of the weights over NCCL may take

json request_json(const GenerationRequest& r);
GenerationRequest request_from(const json& j);
json event_json(const EngineEvent& e);
EngineEvent event_from(const json& j);
json options_json(const EngineOptions& o);
EngineOptions options_from(const json& j);
json stats_json(const EngineStats& s);
EngineStats stats_from(const json& j);
// Bytes as hexadecimal digits and back (the NCCL id in the welcome).
std::string hex(const std::string& bytes);
std::string unhex(const std::string& digits);
// A message's JSON object, or an internal error naming the side `from` that sent something else.
Result<json> parse(const std::string& bytes, const char* from);

}  // namespace kiln::remote_wire
