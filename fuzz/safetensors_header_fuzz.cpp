// Fuzz target (fuzz_common.h): the input is a .safetensors file (8-byte header length, JSON header,
// data). Opening may fail with a Status; every tensor of a file that opens must either be refused
// by find() or lie within the file, with a size that matches its shape and dtype.
#include "fuzz_common.h"
#include "model/safetensors.h"

int kiln::fuzz::safetensors_header(const uint8_t* data, size_t size) {
  Result<SafetensorsFile> f = SafetensorsFile::open(write_input("safetensors_header", data, size));
  if (!f.ok()) return 0;
  for (const std::string& name : f->names()) {
    Result<TensorInfo> t = f->find(name);
    if (!t.ok()) continue;
    const auto* begin = static_cast<const uint8_t*>(t->data);
    if (t->nbytes() < 0 || t->nbytes() > static_cast<int64_t>(size))
      invariant_failed("safetensors_header", "tensor '" + name + "' is larger than the file");
    // Touch the first and last byte: inside the mapping, or the sanitizer reports it.
    if (t->nbytes() > 0) {
      volatile uint8_t a = begin[0], b = begin[t->nbytes() - 1];
      (void)a, (void)b;
    }
  }
  (void)f->metadata();
  return 0;
}

KILN_FUZZ_ENTRY(safetensors_header)
