// Executor: runs the engine's steps on the model. It owns the KV storage (the page pool's slots:
// per layer k, v [num_pages * page_size, Hkv, D]) and an inference workspace allocated once, with
// every per-step buffer at a fixed address (packed inputs, page tables, logits, sampling parameters
// and outputs, the sampler's scratch, the token-count table for penalties), updated in place.
//
// A step (a StepPlan of the scheduler) becomes one packed forward: the planned tokens of every
// entry concatenated, their positions and KV slots, q/page indptr arrays, the entries' page lists
// and last-page lengths, the rows whose logits are wanted (the sampled rows first, then the prompt
// score rows, whose log-probabilities of their next prompt token come from the cross-entropy op
// on the same logits: log_softmax of the raw model output). The host packs them into pinned
// staging; the step's first kernel reads them from there (ops::stage_step_inputs) and its last one
// writes the sampled tokens (and log-probs when asked) into pinned outputs
// (ops::publish_step_outputs), waited for with an event: no copy runs between two steps. Two steps
// may be in flight: a decode step launched while the step before it runs takes its input tokens
// from that step's samples on the device (launch's `continued_from`), so the host plans and issues
// it without waiting; each step in flight has its own pinned staging and output buffers (two sides,
// used in turn). Pure decode steps are padded to a batch-size bucket (1, 2, 4, ... up to
// max_running) with rows that write no KV and requests with no queries (the padding rule of
// kernels/ops.h), so that on CUDA they replay a graph captured once per (batch bucket, context
// bucket, sampler mode, outputs, side), bit-exact against the same step run eagerly, without
// allocating.
// Thread safety: none; the engine thread drives it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <tuple>
#include <memory>
#include <utility>
#include <vector>

#include "infer/scheduler.h"
#include "kernels/sampling.h"
#include "model/transformer.h"

namespace kiln {

struct ExecutorConfig {
  int32_t num_pages = 0;            // 0: a fraction of the device memory free after everything else
  double kv_memory_fraction = 0.85;  // and a warm-up of the largest steps (CUDA; on the CPU four
                                     // full-length sequences within 2 GiB)
  int32_t page_size = 16;
  int32_t max_running = 256;
  int32_t max_step_tokens = 8192;
  int32_t max_seq_len = 0;  // longest sequence (prompt + generated) a request may reach
  bool use_graphs = true;
  int32_t max_score_rows = 0;  // prompt-scoring rows per step (the scheduler's budget)
};

// The result of sampling one entry.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                         // when the row asked for log-probs
  std::vector<std::pair<int32_t, float>> top;   // top_logprobs alternatives, most likely first
};

// The attention bound a decode graph is captured for when the step's longest context is kv_len:
// powers of two from 1024 up to max_seq_len (a tight bound keeps the split-KV decode grid small; one
// graph serves every context up to its bound).
int32_t decode_context_bucket(int32_t kv_len, int32_t max_seq_len);

class Executor {
 public:
  static Result<std::unique_ptr<Executor>> create(const Transformer& model, const ExecutorConfig& config);

  const ExecutorConfig& config() const { return config_; }
  // Bytes of one token's keys and values over all layers.
  static int64_t kv_bytes_per_token(const Transformer& model);

  // Runs `plan`. rows[i] are the sampling parameters of the i-th entry that wants logits (their
  // `position` already set); returns one SampledToken per such entry, in plan order.
  Result<std::vector<SampledToken>> run(const StepPlan& plan, const std::vector<ops::SamplingRow>& rows);
  // run() in two halves, so that the caller works while the device runs the step: launch() packs,
  // copies and issues it (the sampled tokens' copy back included); wait() waits for the oldest step
  // in flight and returns its tokens. At most two steps in flight; nothing else may touch the
  // executor in between (counts rows, reset_counts).
  // continued_from (a continuation of the one step in flight): for i < continued_from.size(),
  // entry i's input token (its last, tokens[start], which the host does not know yet:
  // tokens.size() == start) is the token that step samples in its row continued_from[i]; such an
  // entry computes one token. The entries after them are planned as usual.
  // constraints: empty, or one per row (ops::adjust_logits); read before launch returns.
  struct RowConstraints {
    const uint32_t* mask = nullptr;  // mask_words() words whose set bits are the tokens it may draw
    const std::vector<std::pair<int32_t, float>>* bias = nullptr;  // (token, added to its logit),
                                                                    // distinct, at most kMaxLogitBias
  };
  void launch(const StepPlan& plan, const std::vector<ops::SamplingRow>& rows,
              const std::vector<int32_t>* continued_from = nullptr,
              const std::vector<RowConstraints>* constraints = nullptr);
  int32_t mask_words() const { return static_cast<int32_t>((vocab_ + 31) / 32); }
  Result<std::vector<SampledToken>> wait();
  bool in_flight() const { return in_flight_ > 0; }
  // After wait(): the log-probabilities of the step's score rows, in plan order (entry by entry,
  // position by position): log p(tokens[j + 1] | tokens[0..j]) for each scored position j.
  const std::vector<float>& prompt_logprobs() const { return prompt_logprobs_; }

  // Rows of the token-count table, one per running request with penalties.
  int32_t acquire_counts_row();
  void release_counts_row(int32_t row);
  // Rebuilds a counts row from a request's prompt and generated ids.
  Status reset_counts(int32_t row, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);

  // Steps that replayed a captured graph, for tests and stats.
  int64_t graph_replays() const { return graph_replays_; }
  // Seconds spent in run() in all, and waiting there for the device (the rest is host work:
  // packing, copies and launches).
  double run_seconds() const { return run_seconds_; }
  double wait_seconds() const { return wait_seconds_; }
  // The host parts: packing the step, and issuing it (copies, launches or graph replay).
  double pack_seconds() const { return pack_seconds_; }
  double issue_seconds() const { return issue_seconds_; }
  // Graph replays: host time in the launch call, and device time between events around it.
  double graph_launch_seconds() const { return graph_launch_seconds_; }
  double graph_device_seconds() const { return graph_device_seconds_; }
  // The same for the replays whose bucket was full (every row a request): a batch's steady decode
  // step, without the cheaper replays of a bucket part-filled as requests finish.
  int64_t full_bucket_replays() const { return full_bucket_replays_; }
  double full_bucket_seconds() const { return full_bucket_seconds_; }
  // Device time between a replay and the one launched right before it (the stream idle, waiting for
  // the host's launch, plus whatever runs between them), and the number of such pairs.
  double graph_gap_seconds() const { return graph_gap_seconds_; }
  int64_t graph_gaps() const { return graph_gaps_; }
  // The device time of the graph replay of the step wait() returned last (0: it ran eagerly).
  double last_graph_seconds() const { return last_graph_seconds_; }
  // The KV storage, for tests (per layer [slots, Hkv, D]).
  const KVCache& kv_cache() const { return cache_; }
  // Test hook: the logits of the last step ([rows, vocab] f32 on the device).
  Tensor last_logits() const { return last_logits_; }

 private:
  Executor(const Transformer& model, const ExecutorConfig& config) : model_(model), config_(config) {}
  Status init();
  // Runs the largest prefill step and the largest decode step once over a one-page scratch cache
  // (every page index 0), so that scratch buffers and GEMM plans exist before the free memory is
  // measured.
  Status warm_up();
  // The host side of a step in flight: pinned staging of its inputs and pinned copies of its
  // outputs, the event its copies back complete on, and what wait() needs to read them.
  struct HostSide {
    TensorBuffer staging;
    TensorBuffer outputs, score_logprobs;  // outputs: the layout of outputs_dev_
    std::unique_ptr<Event> done;
    int64_t launch = 0;  // the step's launch number
    std::vector<ops::SamplingRow> rows;  // the step's sampling rows (their log-prob requests)
    int32_t score_rows = 0;
    bool timed_graph = false;
    bool full_bucket = false;  // a replay whose bucket rows are all real requests
  };
  // Fills `side`'s staging buffer for `plan`, padding a pure decode step to `bucket` rows when > 0.
  struct Packed {
    int32_t tokens = 0, requests = 0, logit_rows = 0, pages = 0, max_q = 0, max_kv = 0;  // tokens: padded rows
    int32_t sampled_rows = 0, score_rows = 0;  // with score rows: logit rows [0, sampled) sample,
                                               // [sampled, sampled + score) score the prompt
    bool trim = false;
    bool every_row = false;  // one logit row per token row, in order (a decode step)
  };
  Packed pack(HostSide& side, const StepPlan& plan, const std::vector<ops::SamplingRow>& rows, int32_t bucket);
  // The staging words a packed step's inputs take (what stage_step_inputs moves without constraints).
  int64_t input_words(const Packed& p) const;
  // The rows' token masks and logit biases after the packed inputs (their offsets into the rows'
  // parameters); returns the words the staging then takes.
  int64_t pack_constraints(HostSide& side, const Packed& p, const std::vector<RowConstraints>& constraints);
  // Word 0 of the staging (the words the step's inputs take) and its continued entries' ids.
  void finish_staging(HostSide& side, int64_t words, const std::vector<int32_t>* continued_from);
  // The step on the device: its inputs from `side`'s staging (ops::stage_step_inputs), the forward
  // and the sampler, then output_words of the outputs into `side`'s pinned copy. A graph captures
  // all of it, so that nothing runs between two replays.
  void issue(const HostSide& side, const Packed& p, bool full, bool masked, int64_t output_words);
  // Words of the outputs (outputs_dev_'s layout) for `rows` rows: tokens (level 0), then their
  // log-probs (1), then their top alternatives (2).
  int64_t output_words(int32_t rows, int32_t level) const;
  static constexpr int64_t kStagingHeaderWords = 32;
  ForwardBatch batch_view(const Packed& p) const;
  ops::SamplingBatch sampling_view(int32_t rows, bool full) const;
  // n words of `buffer` from `offset`, as `dtype` (i32 or f32).
  static Tensor output_view(const TensorBuffer& buffer, int64_t offset, int64_t n, DType dtype);
  void forward_and_sample(const Packed& p, bool full, bool masked);
  int32_t bucket_for(int32_t batch) const;
  int32_t context_bucket(int32_t kv_len) const { return decode_context_bucket(kv_len, config_.max_seq_len); }

  const Transformer& model_;
  Backend& be() const { return model_.backend(); }
  ExecutorConfig config_;
  int64_t vocab_ = 0;
  int32_t max_pages_per_step_ = 0;
  KVCache cache_;
  ForwardWorkspace ws_;
  // The packed step inputs: host staging (pinned, one per side) and device buffer, same layout:
  // fixed sections (offsets below), then from off_tokens_ the ids, positions and slots of a step's
  // padded token rows and its page lists, so that one copy moves a step's inputs (a captured
  // graph's views are fixed: its steps have the bucket's token count).
  TensorBuffer staging_dev_;
  int64_t off_q_indptr_ = 0, off_page_indptr_ = 0, off_last_page_ = 0, off_last_rows_ = 0, off_logit_rows_ = 0,
          off_params_ = 0, off_targets_ = 0, off_tokens_ = 0, staging_ints_ = 0;
  int32_t max_logit_rows_ = 0;  // max_running + max_score_rows
  // Sampler buffers.
  // The sampler's outputs in one i32 buffer, so that one copy brings back what a step asks for:
  // tokens [max_running] | log-probs [max_running] f32 | top ids [max_running, kMaxTopLogprobs] |
  // top log-probs [max_running, kMaxTopLogprobs] f32.
  TensorBuffer outputs_dev_;
  int64_t off_out_logprobs_ = 0, off_out_top_ids_ = 0, off_out_top_logprobs_ = 0, output_words_ = 0;
  TensorBuffer sampler_ws_, counts_;
  TensorBuffer counts_upload_;  // [max_seq_len] i32 device: ids for reset_counts
  TensorBuffer score_logprobs_dev_;  // [max_score_rows] f32
  std::vector<int32_t> score_rows_scratch_;  // [max_score_rows]: pack's score rows before they move
  std::vector<float> prompt_logprobs_;
  std::vector<int32_t> free_counts_rows_;
  std::array<HostSide, 2> sides_;
  int32_t next_side_ = 0;  // the side the next launch uses; the oldest in flight is next_side_ - in_flight_
  int32_t in_flight_ = 0;
  Tensor last_logits_;
  // A captured step: its shape, its sampler and outputs, and the host side whose staging and
  // outputs it moves (the sides alternate, so each shape has a graph per side).
  struct GraphKey {
    int32_t batch, context;
    bool full_sampler;
    int32_t output_level;  // output_words' level
    int32_t side;
    bool masked;  // token masks or logit biases applied before sampling
    bool operator<(const GraphKey& o) const {
      return std::tie(batch, context, full_sampler, output_level, side, masked) <
             std::tie(o.batch, o.context, o.full_sampler, o.output_level, o.side, o.masked);
    }
  };
  std::map<GraphKey, std::unique_ptr<CapturedWork>> graphs_;
  bool graphs_ok_ = true;
  int64_t graph_replays_ = 0;
  double run_seconds_ = 0, wait_seconds_ = 0, pack_seconds_ = 0, issue_seconds_ = 0;
  double graph_launch_seconds_ = 0, graph_device_seconds_ = 0, last_graph_seconds_ = 0, graph_gap_seconds_ = 0;
  int64_t full_bucket_replays_ = 0;
  double full_bucket_seconds_ = 0;
  int64_t graph_gaps_ = 0;
  // Events around the replays, by launch number modulo 3: the step waited for, the one before it
  // (for the gap) and the one in flight after it never share a slot.
  struct GraphEvents {
    std::unique_ptr<Event> start, end;
  };
  std::array<GraphEvents, 3> graph_events_;
  int64_t launches_ = 0;
  int64_t last_timed_launch_ = -2;  // the launch number of the last replay waited for
};

}  // namespace kiln
