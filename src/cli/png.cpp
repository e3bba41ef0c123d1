// PNG encoder (see png.h). Chunk layout per the PNG specification: u32 big-endian length, 4-byte
// type, data, CRC-32 (zlib's crc32, the ISO 3309 polynomial PNG names) over type and data.
#include "cli/png.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kiln::cli {
namespace {

constexpr size_t kIdatChunkBytes = 256 * 1024;  // the deflated stream is cut into chunks of this size

void put_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
}

void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.append(type, 4);
  out.append(data);
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(out.data() + start), static_cast<uInt>(4 + data.size()));
  put_be32(out, static_cast<uint32_t>(crc));
}

}  // namespace

Result<std::string> encode_png_rgb(const std::vector<uint8_t>& rgb, int width, int height) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * height * 3)
    return invalid_argument("PNG: " + std::to_string(width) + "x" + std::to_string(height) +
                            " pixels do not match " + std::to_string(rgb.size()) + " bytes of RGB");
  // Rows behind a filter-type byte (0: none; the flat colours of a chart deflate well as they are).
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  std::string raw;
  raw.reserve((row_bytes + 1) * height);
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(rgb.data()) + y * row_bytes, row_bytes);
  }
  uLongf deflated_size = compressBound(static_cast<uLong>(raw.size()));
  std::string deflated(deflated_size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(deflated.data()), &deflated_size, reinterpret_cast<const Bytef*>(raw.data()),
                static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION) != Z_OK)
    return Status(StatusCode::internal, "PNG: zlib could not compress the image");
  deflated.resize(deflated_size);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(width));
  put_be32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // bit depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "tEXt", std::string("Software\0kiln", 13));
  for (size_t at = 0; at < deflated.size(); at += kIdatChunkBytes)
    put_chunk(out, "IDAT", deflated.substr(at, kIdatChunkBytes));
  put_chunk(out, "IEND", "");
  return out;
}

Status write_png_rgb(const std::string& path, const std::vector<uint8_t>& rgb, int width, int height) {
  Result<std::string> png = encode_png_rgb(rgb, width, height);
  if (!png.ok()) return png.status();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return io_error("cannot create '" + path + "': " + std::strerror(errno) + "; choose another --output");
  const bool written = std::fwrite(png->data(), 1, png->size(), f) == png->size();
  if (std::fclose(f) != 0 || !written) return io_error("cannot write '" + path + "' (disk full?)");
  return Status::Ok();
}

}  // namespace kiln::cli
