// Our image folder listing and decoders as a tool, for
// test_image_folder_vs_torchvision.py:
//
//   image_probe list ROOT
//       one JSON object: {"classes": [...], "samples": [[path, class], ...]}
//       (listImageFolder's order), or {"error": message}
//   image_probe decode OUTDIR FILE...
//       per FILE one JSON line: {"file", "c", "h", "w", "raw"} with the CHW
//       RGB bytes written to raw = OUTDIR/<n>.raw, or {"file", "error"}
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/train/image_decode.h"
#include "ddprun/train/image_folder.h"

using namespace ddprun::train;
using nlohmann::json;

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "list" && argc == 3) {
    json out;
    try {
      const ImageFolderListing l = listImageFolder(argv[2]);
      out["classes"] = l.classes;
      out["samples"] = json::array();
      for (size_t i = 0; i < l.paths.size(); ++i) out["samples"].push_back({l.paths[i], l.labels[i]});
    } catch (const ddprun::Error& e) {
      out = {{"error", e.message()}};
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (cmd == "decode" && argc >= 3) {
    for (int i = 3; i < argc; ++i) {
      json line = {{"file", argv[i]}};
      try {
        const ImageU8 im = decodeImage(argv[i], 3);
        const std::string raw = std::string(argv[2]) + "/" + std::to_string(i - 3) + ".raw";
        std::ofstream(raw, std::ios::binary)
            .write(reinterpret_cast<const char*>(im.px.data()), static_cast<std::streamsize>(im.px.size()));
        line.update({{"c", im.c}, {"h", im.h}, {"w", im.w}, {"raw", raw}});
      } catch (const ddprun::Error& e) {
        line["error"] = e.message();
      }
      std::cout << line.dump() << "\n";
    }
    return 0;
  }
  std::fprintf(stderr, "usage: image_probe list ROOT | image_probe decode OUTDIR FILE...\n");
  return 2;
}
