// The Muon fixture (see muon_fixture.h).
#include "muon_fixture.h"

#include <cstring>

#include "test_util.h"

namespace kiln::test {

std::vector<float> MuonFixture::get(const std::string& name) const {
  Result<TensorInfo> t = file.find(name);
  KILN_ASSERT(t.ok() && t->dtype == DType::f32);
  std::vector<float> out(static_cast<size_t>(t->shape.numel()));
  std::memcpy(out.data(), t->data, out.size() * sizeof(float));
  return out;
}

const MuonFixture& muon_fixture() {
  static const MuonFixture* f = [] {
    Result<SafetensorsFile> file = SafetensorsFile::open(testdata_dir() + "/muon/muon.safetensors");
    KILN_ASSERT(file.ok());
    Result<ModelConfig> config = load_model_config(testdata_dir() + "/muon");
    KILN_ASSERT(config.ok());
    nlohmann::json cases = nlohmann::json::parse(file->metadata().at("cases"));
    std::string no_decay = file->metadata().at("no_decay");
    return new MuonFixture{std::move(*file), std::move(*config), std::move(cases), std::move(no_decay)};
  }();
  return *f;
}

OptimizerOptions muon_case_options(const nlohmann::json& c) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::muon;
  o.lr = c.at("lr").get<float>();
  o.weight_decay = c.at("weight_decay").get<float>();
  o.beta1 = c.at("betas")[0].get<float>();
  o.beta2 = c.at("betas")[1].get<float>();
  o.eps = c.at("eps").get<float>();
  o.clip_norm = c.at("clip_norm").get<float>();
  o.muon_momentum = c.at("momentum").get<float>();
  o.muon_nesterov = c.at("nesterov").get<bool>();
  o.muon_ns_steps = c.at("ns_steps").get<int>();
  o.muon_adjust_lr = c.at("adjust_lr").get<std::string>() == "original" ? ops::MuonAdjustLr::original
                                                                         : ops::MuonAdjustLr::match_rms_adamw;
  return o;
}

void set_hf_tensors(Backend& be, const ParameterSet& p, Tensor flat, const std::string& prefix) {
  for (const HfTensor& t : p.layout().hf) {
    std::vector<float> v = muon_fixture().get(prefix + t.name);
    Tensor host;
    host.data = v.data();
    host.dtype = DType::f32;
    host.shape = Shape{static_cast<int64_t>(v.size())};
    const Tensor dst = p.hf_view(flat, t);
    ASSERT_EQ(dst.numel(), host.numel()) << t.name;
    be.copy(dst, host.view(dst.shape));
  }
}


}  // namespace kiln::test
