#include "common/grpc/tls_files.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace varipipe {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  }
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": not a PEM file"));
  }
  return text;
}

absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        files.cert_file.empty() ? "--tls_key needs --tls_cert (the certificate of the key)"
                                : "--tls_cert needs --tls_key (the certificate's private key)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  VP_RETURN_IF_ERROR(CheckPair(files));
  if (files.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs the server's --tls_cert and --tls_key (--tls_ca alone verifies clients only)");
  }
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  VP_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(files.cert_file, "--tls_cert"));
  VP_ASSIGN_OR_RETURN(pair.private_key, ReadPem(files.key_file, "--tls_key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  VP_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(files.ca_file, "--tls_ca"));
  options.client_certificate_request =
      files.ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFiles(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  VP_RETURN_IF_ERROR(CheckPair(files));
  grpc::SslCredentialsOptions options;
  VP_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(files.ca_file, "--tls_ca"));
  VP_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem(files.cert_file, "--tls_cert"));
  VP_ASSIGN_OR_RETURN(options.pem_private_key, ReadPem(files.key_file, "--tls_key"));
  return grpc::SslCredentials(options);
}

}  // namespace varipipe
