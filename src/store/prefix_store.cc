#include "ddprun/store/prefix_store.h"

namespace ddprun::store {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  timeout_ = base_->timeout();
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(join(k));
  return out;
}

void PrefixStore::set(const std::string& key, std::string_view value) {
  base_->set(join(key), value);
}
std::string PrefixStore::get(const std::string& key) { return base_->get(join(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(join(key), delta);
}
std::string PrefixStore::compareSet(const std::string& key, std::string_view expected,
                                    std::string_view desired) {
  return base_->compareSet(join(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(join(keys));
}
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  base_->wait(join(keys), timeout);
}
bool PrefixStore::deleteKey(const std::string& key) { return base_->deleteKey(join(key)); }
int64_t PrefixStore::numKeys() { return base_->numKeys(); }
void PrefixStore::append(const std::string& key, std::string_view value) {
  base_->append(join(key), value);
}
std::vector<std::string> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  return base_->multiGet(join(keys));
}
void PrefixStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  base_->multiSet(join(keys), values);
}

}  // namespace ddprun::store
